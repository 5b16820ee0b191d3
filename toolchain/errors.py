"""The failures a user is shown: one line that names the file and field (SpecError) or the step and
what to do (StageFailed), never a traceback. Every wing may raise them; the engine catches
StageFailed in the worker."""
from __future__ import annotations

from doit.exceptions import InvalidDodoFile


class SpecError(InvalidDodoFile):
    """A user mistake in a spec: doit prints 'ERROR: <message>' and exits 3, no traceback."""


class StageFailed(Exception):
    """An expected failure (bad model, CPU partition, accuracy miss): one clear
    message, no traceback."""
