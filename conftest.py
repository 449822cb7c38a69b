"""Switches the verify pytest plugin on for this repo's pytest runs.

The installed package registers no pytest11 entry point, so other pytest projects in the
same environment never see it; here `pytest --level L1 -n auto -k adamw` works because of
this line (a user's project does the same, or runs `pytest -p verify`).
"""
pytest_plugins = ["verify.running.pytest_plugin"]
