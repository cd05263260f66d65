"""`trimtab token create|list|revoke`: manage API tokens directly in the store (no running server needed).

This is how a head node gets its first tokens before it may listen on a non-loopback address, and how agents and
jobs get theirs. Secrets are printed once (or written to a 0600 file) and stored only as SHA-256 digests.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from trimtab.cli.options import db_option, misconfigured
from trimtab.paths import default_db_url, private_dir, write_private_file


def _engine(db_url):
    from trimtab.store.engine import open_engine
    from trimtab.store.errors import StoreError
    from trimtab.store.migrate import migrate

    try:
        engine = open_engine(db_url or default_db_url())
        migrate(engine)
    except StoreError as exc:  # a permanent refusal (a damaged file, no such database) exits 78, as `up` does
        raise (misconfigured(str(exc)) if exc.permanent else click.ClickException(str(exc))) from exc
    return engine


@click.group()
def token():
    """Create, list and revoke API tokens (scopes: agent = ingest, job = register/report jobs, admin = all)."""


@token.command("create")
@db_option
@click.option("--name", required=True, help="What the token is for, e.g. 'agents-rack-3'.")
@click.option("--scope", type=click.Choice(["agent", "job", "admin"]), required=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the secret to this file instead of printing it: always mode 0600, replacing (never "
                   "following) a symlink or an older file of wider mode; a missing directory is made (0700). Best "
                   "outside a git checkout, e.g. ~/.config/trimtab/NAME.token.")
def create(db_url, name, scope, out):
    """Create a token and show its secret once."""
    from trimtab.api.auth import create_token

    if out is not None:  # before the token exists: a directory that cannot be made leaves no token behind
        try:
            private_dir(out.parent)
        except OSError as exc:
            raise click.ClickException(f"cannot write {out}: {exc}") from exc
    engine = _engine(db_url)
    try:
        stored, secret = create_token(engine, name, scope)
    finally:
        engine.dispose()
    if out is not None:
        try:
            write_private_file(out, secret + "\n")
        except OSError as exc:
            raise click.ClickException(f"cannot write {out}: {exc} (token {stored.id} exists: revoke it, or run "
                                       f"again with another --out)") from exc
        click.echo(f"token {stored.id} ({scope}) written to {out}")
    else:
        click.echo(secret)
        click.echo(f"token {stored.id} ({scope}): the secret above is shown once; it is stored only as a digest", err=True)


@token.command("list")
@db_option
@click.option("--json", "as_json", is_flag=True)
def list_(db_url, as_json):
    """List tokens (never their secrets)."""
    from trimtab.store.tokens import list_tokens

    engine = _engine(db_url)
    try:
        rows = list_tokens(engine)
    finally:
        engine.dispose()
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(t) for t in rows], indent=2))
        return
    for t in rows:
        state = "revoked" if t.revoked else "active"
        click.echo(f"{t.id:>4}  {t.scope:<6} {state:<8} {t.name}")


@token.command("revoke")
@db_option
@click.argument("token_id", type=int)
def revoke_(db_url, token_id):
    """Revoke a token by id; requests with it get 401 from then on."""
    from trimtab.store.tokens import revoke

    engine = _engine(db_url)
    try:
        found = revoke(engine, token_id)
    finally:
        engine.dispose()
    if found is None:
        raise click.ClickException(f"no token with id {token_id}")
    click.echo(f"token {token_id} revoked")
