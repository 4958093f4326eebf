"""StarPO-S on the two-armed bandit: does the agent learn to prefer the arm with the higher expected value?

The tiny CPU model is first warm-started on demonstrations that pick an arm at random (the format, no
preference), so whatever preference it ends with, RL taught it. Dragon pays 1.0 with probability 0.25,
Phoenix 0.15 always: success is choosing Dragon. Tested on a 2-core CPU (see the README for the figures).

    python tuned_examples/starpo_bandit.py [--iterations 10] [--model smollm2-135m] [--output-dir DIR]
"""

from rllib_ragen.experiment import ExperimentArgs, parse_args, run_experiment
from rllib_ragen.rollout.scripted import random_arm_policy

DEFAULTS = ExperimentArgs(
    env="rllib_ragen/Bandit-v0", iterations=10, output_dir="outputs/starpo_bandit",
    num_groups=8, group_size=8, rollout_filter_ratio=1.0,  # single-turn: every group informs the update
    lr=5e-4, critic_lr=1e-3, max_turns=1, max_new_tokens_per_turn=32, validation_size=128,
    warm_start_episodes=256, warm_start_steps=60,
)
PASS_BAR = 0.15  # the better arm's share on validation must rise at least this much

if __name__ == "__main__":
    args = parse_args(DEFAULTS)
    run_experiment(args, random_arm_policy(seed=args.seed, enable_thinking=args.enable_thinking), pass_bar=PASS_BAR)
