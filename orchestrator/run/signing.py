"""Decisions nobody can forge: each person's Ed25519 key pair, and the signatures on their
decisions.

    $XDG_CONFIG_HOME/ticketgraph/signing.key   the private half (default ~/.config/...;
                                               TICKETGRAPH_SIGNING_KEY names another file):
                                               only where people decide, readable by its
                                               owner alone
    <workspace>/keys/<user>.<key id>.pub        the public halves the workspace trusts
                                               (TICKETGRAPH_TRUSTED_KEYS names another
                                               folder: a worker's own copy)

`approve` and `reject` sign what they decide (run, ticket, call, tool, the arguments' hash,
the verdict, who, when, why) with the private half; every worker verifies with the public
halves before a decision counts. A worker holds no private half, so nothing a worker or a
ticket can make it do signs a decision, and a file written or edited by hand does not
verify. `ticketgraph init` and `ticketgraph keys init` set a user's pair up.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from orchestrator.errors import ConfigError
from orchestrator.run.workspace import Workspace

KEYS = "keys"  # the workspace's folder of trusted public halves
SETUP = "`ticketgraph keys init` in the workspace makes your key pair and trusts its public half"


def user_name() -> str:
    """Who this process runs as (the `by` of a decision, the name of a public half)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container): say who it was not
        return "unknown"


def private_path() -> Path:
    """Where this user's private half is kept."""
    if named := os.environ.get("TICKETGRAPH_SIGNING_KEY"):
        return Path(named)
    home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(home) / "ticketgraph" / "signing.key"


def key_id(public: Ed25519PublicKey) -> str:
    """A short name of a public half (the start of its hash)."""
    return hashlib.sha256(_raw(public)).hexdigest()[:16]


def _raw(public: Ed25519PublicKey) -> bytes:
    return public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def own_key() -> Ed25519PrivateKey | None:
    """This user's private half, if there is one; `ConfigError` if it cannot be read."""
    path = private_path()
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError as exc:
        raise ConfigError(
            f"{path} is not a signing key ({exc}); move it away, then {SETUP}"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(f"{path} is not an Ed25519 key; move it away, then {SETUP}")
    return key


def set_up(workspace: Workspace, user: str | None = None) -> list[str]:
    """Make this user's key pair if there is none, and trust its public half in
    `workspace`; what was done, a line each."""
    user = user or user_name()
    done, key = [], own_key()
    if key is None:
        key = Ed25519PrivateKey.generate()
        path = private_path()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
        done.append(f"signing key made: {path} (private: keep it where people decide)")
    public = key.public_key()
    name = workspace.root / KEYS / f"{_safe(user)}.{key_id(public)}.pub"
    if key_id(public) not in trusted(workspace, own_folder=True):
        name.parent.mkdir(parents=True, exist_ok=True)
        name.write_text(f"ed25519 {base64.b64encode(_raw(public)).decode()} {user}\n")
        done.append(
            f"public half trusted: {name.relative_to(workspace.root)} (copy it to every worker)"
        )
    return done


def _safe(user: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in user) or "user"


def trusted(workspace: Workspace, own_folder: bool = False) -> dict[str, Ed25519PublicKey]:
    """The public halves decisions are verified with, by key id: the workspace's keys/
    (or the folder TICKETGRAPH_TRUSTED_KEYS names, unless `own_folder`)."""
    named = os.environ.get("TICKETGRAPH_TRUSTED_KEYS")
    folder = Path(named) if named and not own_folder else workspace.root / KEYS
    try:
        files = sorted(
            (e.name, e.stat().st_mtime_ns, e.stat().st_size, e.inode())
            for e in os.scandir(folder)
            if e.name.endswith(".pub")
        )
    except OSError:
        return {}
    # Read again only when a public half was added, removed or rewritten: a worker checks
    # every decision of every waiting call on every pass.
    seen = _TRUSTED.get(folder)
    if seen is None or seen[0] != files:
        seen = _TRUSTED[folder] = (files, _read_keys(folder, [name for name, *_ in files]))
    return dict(seen[1])


_TRUSTED: dict[Path, tuple[list[tuple[str, int, int, int]], dict[str, Ed25519PublicKey]]] = {}


def _read_keys(folder: Path, names: list[str]) -> dict[str, Ed25519PublicKey]:
    found: dict[str, Ed25519PublicKey] = {}
    for name in names:
        try:
            raw = base64.b64decode((folder / name).read_text().split()[1], validate=True)
            public = Ed25519PublicKey.from_public_bytes(raw)
        except (OSError, IndexError, ValueError):
            continue  # not a public half: trusts nobody
        found[key_id(public)] = public
    return found


def signer(workspace: Workspace) -> Ed25519PrivateKey:
    """The private half this user signs decisions with; `ConfigError` (exit 78) saying how
    to set one up when there is none, or the workspace does not trust it."""
    key = own_key()
    if key is None:
        raise ConfigError(f"no signing key at {private_path()} to sign decisions with: {SETUP}")
    if key_id(key.public_key()) not in trusted(workspace, own_folder=True):
        raise ConfigError(
            f"the workspace does not trust your signing key ({private_path()}): its public "
            f"half is not in {workspace.root / KEYS}; {SETUP}"
        )
    return key


def _payload(fields: dict[str, Any]) -> bytes:
    signed = {k: v for k, v in fields.items() if k != "signature"}
    return json.dumps(signed, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(key: Ed25519PrivateKey, fields: dict[str, Any]) -> tuple[str, str]:
    """(key id, signature) of `fields` (a decision's, its signature left out)."""
    kid = key_id(key.public_key())
    signature = key.sign(_payload({**fields, "key_id": kid}))
    return kid, base64.b64encode(signature).decode()


def flaw(workspace: Workspace, fields: dict[str, Any]) -> str | None:
    """Why a decision's signature does not count, or None if it verifies with a trusted key."""
    kid, signature = fields.get("key_id"), fields.get("signature")
    if not kid or not signature:
        return "it is not signed (a decision is made with `ticketgraph approve` or `reject`)"
    public = trusted(workspace).get(str(kid))
    if public is None:
        return f"it is signed with key {kid}, which this workspace does not trust"
    try:
        public.verify(base64.b64decode(str(signature)), _payload(fields))
    except (InvalidSignature, ValueError):
        return "its signature does not verify (it was changed after it was signed)"
    return None
