"""Process wiring: what a Celery worker, beat and the development stack start, and the Celery
signals they listen to, each in one place per process role, owning and stopping its threads.
"""
