"""The web app as a real process and a signed-in client, and a webhook receiver."""
