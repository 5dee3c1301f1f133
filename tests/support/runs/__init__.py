"""The test run itself: failures named as they happen, and runs cut short on purpose."""
