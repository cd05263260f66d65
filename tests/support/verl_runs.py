"""What the verl end-to-end tests share: the phase columns a report's step time splits into, the README's one
setting that attaches trimtab to a verl run, and verl's own workers as Ray actors (the GPU stubbed)."""

from __future__ import annotations

PHASE_COLUMNS = ("generation_s", "evaluation_s", "communication_s", "update_s", "validation_s", "checkpoint_s",
                 "wait_s", "other_s")


def attached(api, tmp_path, job: str, *extra: str) -> list[str]:
    """The README's one setting (plus the token file it names)."""
    token = tmp_path / "job.token"
    token.write_text(api.token("job") + "\n")
    return [f"+trimtab.server={api.url}", f"+trimtab.token_file={token}", f"trainer.experiment_name={job}", *extra]


def verl_workers(gpu_of_each: dict[str, list[str]]) -> dict[str, list]:
    """verl's own ``Worker`` as Ray actors, one per GPU, with the environment ``RayWorkerGroup._create_worker`` gives
    them. Stubbed: the GPU. On CPU Ray assigns none, so each actor's ``CUDA_VISIBLE_DEVICES`` is set by hand to what
    Ray would set on a GPU node (and ``num_cpus=0``: the harness's two CPUs belong to TransferQueue)."""
    import ray
    from verl.single_controller.base.worker import Worker

    out = {}
    for pool, gpus in gpu_of_each.items():
        out[pool] = [ray.remote(Worker).options(num_cpus=0, name=f"{pool}Worker_0:{rank}", runtime_env={"env_vars": {
            "WORLD_SIZE": str(len(gpus)), "RANK": str(rank), "WG_PREFIX": pool, "WG_BACKEND": "ray",
            "RAY_LOCAL_WORLD_SIZE": str(len(gpus)), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29555",
            "CUDA_VISIBLE_DEVICES": gpu}}).remote() for rank, gpu in enumerate(gpus)]
    # up, as init_workers() leaves them before fit: each is a new process importing verl (slow on a busy CPU)
    ray.get([w.__ray_call__.remote(lambda _: None) for ws in out.values() for w in ws], timeout=600)
    return out
