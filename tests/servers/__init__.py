"""Scripted model servers on 127.0.0.1 that the real coder CLIs talk to in the tests."""
