"""The token a training job reports with: what ``attach`` accepts, and what a server's refusal of it means.

A token is a str (what ``trimtab token create`` printed, or its ``--out`` file's content); anything else — the
``token=...`` Ellipsis of an example copied as it stands, bytes, a Path — is refused at ``attach`` with a TypeError
saying what to pass, instead of being sent as a header the server refuses on every request.

A refused token is not an outage: the server answered. The reporter keeps the reports (they wait and are retried,
since an admin may fix the token), says once at ERROR which server refused it and what to do, and its ``stats()``
say ``auth_refused``, not ``offline``.
"""

from __future__ import annotations

import os
from typing import Optional

from trimtab.contract.servers import answer_detail
from trimtab.paths import token_from

# What to do, per refusal status ({job}: the job's name).
AUTH_REFUSED = {
    401: "the server does not know this token (mistyped, revoked, made for another store, or none given): create "
         "one on the server's store with `trimtab token create --name {job} --scope job --out "
         "~/.config/trimtab/{job}.token` and pass its content as attach(token=...) or $TRIMTAB_TOKEN",
    403: "this token may not write job {job}: it needs a token of scope 'job' (the one that registered the job, "
         "or any while no job token owns it) or 'admin'; an admin may revoke the owner's token to hand the job over",
}


def job_token(token: Optional[str], env: str = "TRIMTAB_TOKEN") -> Optional[str]:
    """The token a job reports with: ``token``, else ``$TRIMTAB_TOKEN``, checked (one line of printable ASCII, what
    ``trimtab token create`` printed); None when neither is given. Anything but a str is a TypeError saying what
    to pass; a str that cannot be a token, a :class:`~trimtab.paths.BadToken` saying what is wrong."""
    if token is not None and not isinstance(token, str):
        raise TypeError(f"token must be a str, the secret `trimtab token create` printed (e.g. "
                        f"open('job.token').read()), or None to use ${env}; got {type(token).__name__} "
                        f"{str(token)[:40]!r}")
    return token_from(token, None, "the token") or token_from(os.environ.get(env), None, f"${env}")


def refusal_line(server: str, job: str, path: str, resp) -> str:
    """The one ERROR line for a server's 401/403 (``resp``): which server, what it said, and what to do."""
    return (f"trimtab: server {server} refused job {job}'s token (HTTP {resp.status_code} to {path}: "
            f"{answer_detail(resp)}); not an outage: reports wait and go once the token is accepted. Fix: "
            f"{AUTH_REFUSED[resp.status_code].format(job=job)}")
