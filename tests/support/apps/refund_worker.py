"""The worker app of `tests.support.apps.refund_app`, in the release `$DEX_TEST_REFUND_RELEASE`."""

from tests.support.apps.refund_app import make_app

app, _dex = make_app()
