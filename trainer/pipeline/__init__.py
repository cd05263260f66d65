"""The reference RL post-training pipeline (actor / critic / reward / reference) the rebalancer acts on."""
