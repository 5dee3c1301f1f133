"""The worker app of `tests.support.apps.effect_class_app`: importing it registers the test's
effect classes in the worker process, as a deployment registers its own in every process."""

from tests.support.apps.effect_class_app import make_app, register_classes

app, _dex = make_app(register_classes())
