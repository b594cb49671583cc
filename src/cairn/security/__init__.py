"""Secrets and credentials: references in the journal, values only at the
moment of use (``cairn.security.secrets``), and a registry of revealed
values that keeps them out of records, errors and logs
(``cairn.security.redaction``)."""

from cairn.security.secrets import (
    Access,
    CallableSecrets,
    EnvSecrets,
    FileSecrets,
    Secret,
    SecretProvider,
    Secrets,
    SecretValue,
)

__all__ = [
    "Access",
    "CallableSecrets",
    "EnvSecrets",
    "FileSecrets",
    "Secret",
    "SecretProvider",
    "SecretValue",
    "Secrets",
]
