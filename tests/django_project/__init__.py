"""A Django project for mailbag.django's tests (tests/test_django*.py): settings read from
the environment, one app (`shop`) with a model written in the same transactions as email."""
