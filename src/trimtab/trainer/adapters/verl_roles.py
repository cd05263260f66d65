"""The device map of a verl run, found rather than typed: each worker group's roles, node, GPUs and worker pids.

verl places roles with a ``ResourcePoolManager`` (pool → GPUs per node, Role → pool): counts, not GPU ids; Ray
picks the GPUs when ``RayWorkerGroup`` starts one actor per GPU (``verl/single_controller/ray/base.py``,
``_create_worker``). So each worker is asked once, when ``fit`` starts, through Ray's ``__ray_call__`` (it runs a
function in the actor, needing no method of verl's): its host, its pid and the GPU ids Ray gave it
(``get_accelerator_ids``; ``CUDA_VISIBLE_DEVICES`` where Ray reports none). Ray's ids are the node's GPU indices,
NVML's numbering; a worker whose ids are GPU UUIDs reports its pid alone, and the daemon finds its GPUs in NVML's
process list on that node (``trimtab.store.jobs``, source ``nvml``).

Roles by worker group (``ray_trainer.py`` and ``v1/trainer_base.py``, ``init_workers`` / ``_setup``):

========================  =================================================================================
``actor_rollout_wg``      ``actor`` and ``rollout`` (the hybrid engine: the rollout replicas sleep on the
                          actor's GPUs), plus ``ref`` when the reference lives in the actor's workers
                          (``ActorRolloutRef``, LoRA's ``ref_in_actor``: ``ref_policy_wg`` is that group)
``ref_policy_wg``         ``ref``, when it is a group of its own
``critic_wg``             ``critic``
rollout replicas          ``rollout``, when the actor's group does not hold it (``hybrid_engine=False``: V1
                          ``separate_async``, the fully-async and one-step-off trainers): the ``workers`` of
                          each ``RolloutReplica`` of verl's ``LLMServerManager`` (V1 separate_async: its
                          ``standalone_server_manager``), one Ray actor per GPU; the fully-async rollouter's
                          ``hybrid_replicas`` too, which sleep on the trainer's GPUs until lent
========================  =================================================================================

The fully-async rollouter's replicas live in another Ray actor: the trainer fetches their worker handles from it
through the rollouter's own ``__ray_call__`` (:func:`rollouter_workers`), so one registration carries every role.

verl 0.9.1 computes rewards in the agent loop (``reward_loop_manager``): no worker group, no ``reward`` role. A
worker group without Ray workers (a test's stand-in) or a worker that does not answer in time gives no placement;
``--device-map`` (``+trimtab.device_map``) overrides the device map either way.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from trimtab.contract.roles import RolePlacement, merge

log = logging.getLogger("trimtab.trainer")
ASK_TIMEOUT_S = 30.0  # a worker busy loading a model answers once it is done; past this, the run goes on without


def _where(actor: Any = None) -> tuple[str, int, list[str]]:
    """Runs inside one worker (``__ray_call__`` passes the actor): its host, pid and GPU ids as Ray gave them."""
    import os
    import socket

    ids: list[str] = []
    try:
        import ray

        ids = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
    except Exception:  # not in Ray, or an older Ray
        pass
    if not ids:
        ids = [x.strip() for x in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if x.strip()]
    return socket.gethostname(), os.getpid(), ids


def replica_workers(owner: Any) -> list:
    """The Ray actors of the rollout replicas ``owner`` (a trainer or the rollouter) holds in verl's
    ``LLMServerManager``; [] where it holds none."""
    replicas: list = []
    for name in ("llm_server_manager", "standalone_server_manager"):  # the latter: V1 separate_async's own pool
        manager = getattr(owner, name, None)
        replicas += list(getattr(manager, "rollout_replicas", None) or [])
        replicas += list((getattr(manager, "hybrid_replicas", None) or {}).values())  # fully-async's lent ones
    return [w for replica in replicas for w in list(getattr(replica, "workers", None) or [])]


def rollouter_workers(rollouter_handle: Any, timeout_s: float = ASK_TIMEOUT_S) -> list:
    """The fully-async rollouter's replica workers, asked of its Ray actor (``__ray_call__`` runs
    :func:`replica_workers` in it); [] where it does not answer."""
    call = getattr(rollouter_handle, "__ray_call__", None)
    if call is None:
        return []
    import ray

    try:
        return list(ray.get(call.remote(replica_workers), timeout=timeout_s))
    except Exception as exc:
        log.warning("trimtab: could not ask verl's rollouter for its replicas (%s); no rollout role reported", exc)
        return []


def groups_and_roles(trainer: Any, rollout_workers: Optional[list] = None) -> list[tuple[list, tuple[str, ...]]]:
    """The trainer's workers by group, each with the roles it holds; ``rollout_workers`` where the rollout replicas
    are not the trainer's own (the fully-async rollouter's)."""
    actor = getattr(trainer, "actor_rollout_wg", None)
    ref = getattr(trainer, "ref_policy_wg", None)
    from trimtab.trainer.adapters.verl_knobs import select

    # the rollout engines inside the actor's workers: every trainer but V1 separate_async and verl/experimental's
    hybrid = bool(select(getattr(trainer, "config", None), "actor_rollout_ref.hybrid_engine", True))
    out = []
    if actor is not None:
        ref_inside = ref is actor or bool(getattr(trainer, "ref_in_actor", False))
        out.append((actor, ("actor",) + (("rollout",) if hybrid else ()) + (("ref",) if ref_inside else ())))
    if ref is not None and ref is not actor:
        out.append((ref, ("ref",)))
    critic = getattr(trainer, "critic_wg", None)
    if critic is not None and getattr(trainer, "use_critic", True):
        out.append((critic, ("critic",)))
    found = [(list(getattr(group, "workers", None) or []), roles) for group, roles in out]
    if not hybrid:
        found.append((replica_workers(trainer) if rollout_workers is None else list(rollout_workers), ("rollout",)))
    return found


def find_roles(trainer: Any, timeout_s: float = ASK_TIMEOUT_S,
               rollout_workers: Optional[list] = None) -> list[RolePlacement]:
    """Each role's node, GPUs and pids, asked of the worker groups' Ray actors; [] where there are none."""
    asked = []
    for workers, roles in groups_and_roles(trainer, rollout_workers):
        for worker in workers:
            call = getattr(worker, "__ray_call__", None)
            if call is not None:
                asked.append((roles, call.remote(_where)))
    if not asked:
        return []
    import ray

    try:
        answers = ray.get([ref for _, ref in asked], timeout=timeout_s)
    except Exception as exc:  # a worker gone or slow: the run goes on, without found roles
        log.warning("trimtab: could not ask verl's workers where they run (%s); no roles reported", exc)
        return []
    placements = []
    for (roles, _), (node, pid, ids) in zip(asked, answers):
        gpus = tuple(int(i) for i in ids if i.isdigit())  # GPU UUIDs: the pid still finds them in NVML's list
        placements += [RolePlacement(role, str(node), gpus, (int(pid),)) for role in roles]
    return merge(placements)
