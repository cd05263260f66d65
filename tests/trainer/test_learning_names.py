"""Each framework's logged names → trimtab's learning signals: the names are produced by the frameworks' own code
(verl's policy-loss and rollout-correction functions, run on small CPU tensors; nothing stubbed), and the mapping
is data (learning_names.toml) that names only signals trimtab knows."""

from __future__ import annotations

import pytest
import torch

from tests.support.frameworks import require
from trimtab.contract.learning import SIGNAL_NAMES
from trimtab.trainer import attach
from trimtab.trainer.adapters.learning_names import TABLE, LearningNames, logged_names


def test_the_table_names_only_known_signals_and_every_framework_has_a_reward():
    for framework, entry in TABLE.items():
        assert set(entry.get("names", {})) | set(entry.get("per_sample_increase", {})) <= set(SIGNAL_NAMES)
        assert "reward" in logged_names(framework), framework
    with pytest.raises(ValueError, match="framework must be one of"):
        LearningNames("megatron")


def test_the_first_name_present_wins_and_non_numbers_are_left_out():
    names = LearningNames("verl")
    got = names.signals({"critic/rewards/mean": 0.2, "critic/score/mean": 0.7, "actor/ppo_kl": float("nan"),
                         "actor/grad_norm": "big", "actor/entropy": torch.tensor(1.5)})
    assert got == {"reward": 0.7, "entropy": 1.5}  # score first; NaN and text are no value; a tensor is read


def test_a_count_since_the_start_becomes_the_steps_share_of_its_samples():
    names = LearningNames("verl")
    key = "fully_async/count/stale_trajectory_processed"
    assert "stale_share" not in names.signals({key: 10}, samples=64)  # the first count has no increase yet
    assert names.signals({key: 42}, samples=64)["stale_share"] == pytest.approx(0.5)
    assert "stale_share" not in names.signals({key: 5}, samples=64)  # a restart's count: no share, never negative
    assert "stale_share" not in names.signals({key: 9}, samples=0)


def test_a_users_own_names_are_read_with_the_prefixes_loggers_add():
    got = LearningNames("user").signals({"train/reward": 1.0, "approx_kl": 0.02, "train_clip_fraction": 0.1})
    assert got == {"reward": 1.0, "kl": 0.02, "clip_fraction": 0.1}
    assert LearningNames("trl").signals({"train/reward": 1.0}) == {}  # TRL's names are its own, unprefixed


def test_verls_own_policy_loss_and_rollout_correction_metrics_map_onto_the_signals():
    require("verl")
    from omegaconf import OmegaConf
    from verl.trainer.ppo import core_algos, rollout_corr_helper

    torch.manual_seed(0)
    old_log_prob = torch.randn(4, 6) * 0.1
    log_prob = old_log_prob + torch.randn(4, 6) * 0.3  # a policy that moved: some ratios clip
    advantages, mask = torch.randn(4, 6), torch.ones(4, 6)
    config = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 3.0,
                               "loss_agg_mode": "token-mean", "policy_loss": {"loss_mode": "vanilla"},
                               "global_batch_info": {}})
    _, loss_metrics = core_algos.compute_policy_loss_vanilla(old_log_prob, log_prob, advantages, mask,
                                                             loss_agg_mode="token-mean", config=config)
    # The rollout engine's log-probs against the trainer's: verl's importance weights and their metrics, with the
    # "rollout_corr/" prefix its trainer adds when it logs them (ray_trainer.py).
    _, is_metrics = rollout_corr_helper.compute_rollout_correction_weights(torch.randn(4, 6) * 0.3, mask)
    verl_logged = {**{k: float(v) for k, v in loss_metrics.items()}, "critic/score/mean": 0.25,
                   **{f"rollout_corr/{k}": v for k, v in is_metrics.items()}}
    got = LearningNames("verl").signals(verl_logged)
    assert got["clip_fraction"] == pytest.approx(loss_metrics["actor/pg_clipfrac"])
    assert got["kl"] == pytest.approx(loss_metrics["actor/ppo_kl"]) and got["reward"] == 0.25
    assert got["eff_sample_size"] == pytest.approx(is_metrics["rollout_is_eff_sample_size"])
    assert 0 < got["clip_fraction"] < 1 and 0 < got["eff_sample_size"] < 1


def test_the_hook_sends_known_signals_and_says_once_which_names_it_does_not_know(caplog):
    hook = attach("learn-names", knobs={"batch_size": (8, 1, 64)})
    with caplog.at_level("WARNING", logger="trimtab.trainer"):
        hook.step_end(samples=8, learning={"reward": 0.5, "kl": 0.01, "actor/pg_clipfrac": 0.2})
        first = hook.last_report.to_wire()
        hook.step_end(samples=8, learning={"reward": 0.6, "actor/pg_clipfrac": 0.2})
    hook.close()
    assert first["learning"] == {"reward": 0.5, "kl": 0.01}
    warned = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(warned) == 1 and "actor/pg_clipfrac" in warned[0]
    hook2 = attach("learn-none", knobs={"batch_size": (8, 1, 64)})
    hook2.step_end(samples=8)
    assert "learning" not in hook2.last_report.to_wire()  # nothing logged: the group is left out, never zeros
    hook2.close()


def test_the_hook_pages_frameworks_by_signals_table_is_the_mapping():
    from pathlib import Path

    from trimtab.trainer.adapters.learning_names import markdown_table

    page = (Path(__file__).resolve().parents[2] / "docs" / "hook.md").read_text(encoding="utf-8")
    assert markdown_table() in page
