"""Helpers the test modules share, imported as ``support.<module>`` (``tests/`` is on
``sys.path``: the root ``tests/conftest.py`` puts it there, and child processes get it through
``PYTHONPATH``)."""
