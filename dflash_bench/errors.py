"""Errors a user can cause. The CLI prints their message as one sentence and exits non-zero."""


class UserError(Exception):
    """Bad input or environment: unknown model, missing file, unreachable server, no docker, ...

    The message is shown to the user as is, so it must be one clear sentence that says what to do.
    """

    exit_code = 2
