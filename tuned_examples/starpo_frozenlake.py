"""StarPO-S on slippery 4x4 FrozenLake: warm start on the optimal policy's moves, then RL on unseen maps.

The ice is slippery (the intended move happens with probability 1/3), so the optimal policy replans after every
step: its demonstrations answer one move per turn, and this job gives the agent 10 turns of one action. The
best achievable success on random maps is about 0.5. Success is measured before and after RL on fixed held-out
maps. Tested on a 2-core CPU (see the README for the figures).

    python tuned_examples/starpo_frozenlake.py [--iterations 20] [--model smollm2-135m] [--output-dir DIR]
"""

from rllib_ragen.experiment import ExperimentArgs, parse_args, run_experiment
from rllib_ragen.rollout.scripted import frozen_lake_optimal_policy

DEFAULTS = ExperimentArgs(
    env="rllib_ragen/FrozenLake-v0", iterations=20, output_dir="outputs/starpo_frozenlake",
    num_groups=8, group_size=8, rollout_filter_ratio=0.5, lr=1e-4, critic_lr=1e-3,
    max_turns=10, max_actions_per_turn=1, max_actions_per_episode=10, max_new_tokens_per_turn=32,
    validation_size=128, warm_start_episodes=500, warm_start_steps=150,
)
PASS_BAR = 0.05  # validation success must rise at least this much over the warm start

if __name__ == "__main__":
    args = parse_args(DEFAULTS)
    run_experiment(args, frozen_lake_optimal_policy(args.enable_thinking), pass_bar=PASS_BAR)
