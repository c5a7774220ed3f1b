"""The Celery app the worker processes of tests/test_celery.py run.

Configured as a Django project would: from the settings, ``CELERY_*`` keys
(the tests write a settings module with the broker they started).
"""

from celery import Celery

app = Celery("distlock_tests")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.include = ["tests.celery_tasks"]
