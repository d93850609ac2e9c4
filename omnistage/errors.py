"""Typed errors: each maps to one HTTP status, so every layer fails loud with a message a user can act on."""

from __future__ import annotations


class OmniError(Exception):
    """Base of every omnistage error. `status_code` is what the server answers with."""

    status_code = 500
    error_type = "InternalServerError"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequestError(OmniError, ValueError):
    """The request breaks a rule; `param` names the field."""

    status_code = 400
    error_type = "BadRequestError"


class ConfigError(OmniError, ValueError):
    """A pipeline or deploy configuration is wrong; raised at start-up, before any request."""

    status_code = 500
    error_type = "ConfigError"


class NotFoundError(OmniError):
    status_code = 404
    error_type = "NotFoundError"


class OverloadedError(OmniError):
    """The bounded admission queue is full; the client should retry later."""

    status_code = 429
    error_type = "RateLimitError"


class NotReadyError(OmniError):
    status_code = 503
    error_type = "ServiceUnavailableError"


class StageError(OmniError):
    """A stage failed while holding a request; carries which stage and what it raised."""

    status_code = 500
    error_type = "StageError"

    def __init__(
        self,
        message: str,
        *,
        stage_id: int | None = None,
        stage_name: str | None = None,
        exc_type: str | None = None,
        param: str | None = None,
    ):
        where = f"stage {stage_id} ({stage_name})" if stage_name else f"stage {stage_id}"
        text = f"{where} failed: {exc_type + ': ' if exc_type else ''}{message}"
        super().__init__(text, param=param)
        self.stage_id = stage_id
        self.stage_name = stage_name
        self.exc_type = exc_type


class StartupTimeoutError(StageError):
    """A stage replica was not ready within its deploy entry's `startup_timeout_s`; the message names the
    replica itself."""

    error_type = "StartupTimeoutError"

    def __init__(self, message: str, *, stage_id: int | None = None, stage_name: str | None = None):
        OmniError.__init__(self, message)
        self.stage_id, self.stage_name, self.exc_type = stage_id, stage_name, None


class StageDeadError(StageError):
    """The stage process died; every request bound to it fails with this."""

    error_type = "StageDeadError"
