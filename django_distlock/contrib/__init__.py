"""Integrations with other libraries, each optional.

Every module here imports its library lazily or on import of the module
itself, never from the rest of the package: django_distlock works without
any of them installed.
"""
