"""Learner overhead: one StarPO update through RLlib against a bare PyTorch loop on the same batch.

Both sides start from the same weights and do the same work on the same rollout batch: one forward pass whose
detached outputs are the score (old log-probs, critic values), GAE from those values, then one optimizer step of
the StarPO loss (clipped surrogate - entropy bonus + clipped value loss) on the same pass's outputs, with AdamW for
the actor and the critic and grad clipping. The baseline calls the same pure objective functions directly, with no
Ray, RLlib batch or metrics machinery, so the ratio is what the RLlib integration costs. Before timing, both
sides' first losses are checked to match. A third side is the learner scoring in a pass of its own without
gradients first, as it must when a batch is trained in several steps (and as it did for every batch before it
reused the step's pass): their ratio is what reading the batch once saves.

First, the cost of every advantage estimator on a synthetic 128 x 4096 batch of 8-turn trajectories (target:
under 0.2 s each), against ``gae`` timed in the same run.

``--full-vs-lora`` instead compares full fine-tuning with LoRA on SmolLM2-135M (GRPO, no critic, so the policy
is all there is): each side runs in its own fresh process on the same rollout batch, and reports its peak memory
(the process's, and the rise above it during the updates), seconds per update (and, interleaved with them, with
the scoring pass apart: GRPO reads a micro-batched batch once too), what it trains and what its checkpoint weighs.

    python benchmarks/learner.py [--model tiny] [--groups 8] [--group-size 4] [--repeats 5] [--estimators-only]
    python benchmarks/learner.py --full-vs-lora [--lora-rank 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import pathlib
import statistics
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import ray  # noqa: E402
import torch  # noqa: E402
from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch  # noqa: E402

from rllib_ragen import StarPOConfig  # noqa: E402
from rllib_ragen.objectives import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageSettings,  # noqa: E402
    aggregate,
    compute_advantages,
    compute_gae,
    masked_whiten,
    place_rewards,
    policy_loss,
    token_logprobs_and_entropy,
    value_loss,
)
from rllib_ragen.objectives.losses import shift_right  # noqa: E402
from rllib_ragen.starpo.update_batch import prepare_update_batch  # noqa: E402
from rllib_ragen.starpo.llm_rl_module import ValueModel  # noqa: E402
from rllib_ragen.starpo.starpo_learner import StarPOTorchLearner  # noqa: E402


class BareLoop:
    """The same update as the StarPO learner, written as a plain PyTorch loop."""

    def __init__(self, policy, config):
        self.config = config
        self.policy = copy.deepcopy(policy)
        self.critic = ValueModel(copy.deepcopy(policy.base_model), policy.config.hidden_size, policy.dtype)
        kwargs = dict(betas=config.adam_betas, weight_decay=config.weight_decay)
        self.actor_opt = torch.optim.AdamW(self.policy.parameters(), lr=config.lr, **kwargs)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=config.critic_lr, **kwargs)

    def _score(self, ids, attention):
        logits = self.policy(input_ids=ids, attention_mask=attention, use_cache=False).logits
        temperature = self.config.temperature
        values = shift_right(self.critic(ids, attention)[:, :-1])  # position t scores token t
        return (*token_logprobs_and_entropy(logits, ids, temperature), values)

    def update(self, batch: dict[str, torch.Tensor]) -> float:
        c = self.config
        ids, attention, mask = batch["input_ids"], batch["attention_mask"], batch["response_mask"]
        logp, entropy, values = self._score(ids, attention)
        old_logp, old_values = logp.detach(), values.detach()  # one step: the step's own pass is the score
        advantages, returns = compute_gae(batch["token_rewards"], old_values, mask, c.gamma, c.lambda_)
        if c.whiten_advantages:  # as the learner does (RAGEN's GAE whitening over generated tokens)
            advantages = masked_whiten(advantages, mask)
        pg, _ = policy_loss(
            logp,
            old_logp * mask,
            advantages,
            mask,
            clip_low=c.clip_ratio_low,
            clip_high=c.clip_ratio_high,
            dual_clip=c.dual_clip,
            aggregation=c.loss_aggregation,
        )
        vf, _ = value_loss(values, old_values, returns, mask, clip=c.value_clip, aggregation=c.loss_aggregation)
        loss = pg - c.entropy_coeff * aggregate(entropy, mask, c.loss_aggregation) + c.vf_loss_coeff * vf
        self.actor_opt.zero_grad(set_to_none=True)
        self.critic_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), c.grad_clip)
        torch.nn.utils.clip_grad_norm_(self.critic.parameters(), c.grad_clip)
        self.actor_opt.step()
        self.critic_opt.step()
        return loss.item()


def estimator_inputs(batch: int = 128, width: int = 4096, turns: int = 8, group_size: int = 8) -> AdvantageInputs:
    """A batch shaped like a long multi-turn rollout: each row alternates replies and observations up to ``width``,
    one reward per turn, random values, and states that repeat within a group (for GiGPO's anchors)."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.zeros(batch, width)
    ends, rewards, states = [], [], []
    span = width // turns
    for row in range(batch):
        row_ends = []
        for turn in range(turns):
            start = turn * span + span // 3  # the first third of each span is the observation
            mask[row, start : (turn + 1) * span] = 1
            row_ends.append((turn + 1) * span - 1)
        ends.append(row_ends)
        rewards.append(torch.randn(turns, generator=generator).tolist())
        states.append([f"state {int(torch.randint(3, (1,), generator=generator))}" for _ in range(turns)])
    token_rewards = place_rewards(ends, rewards, (batch, width), per_turn=True)
    return AdvantageInputs(
        token_rewards=token_rewards,
        response_mask=mask,
        returns=token_rewards.sum(-1),
        group_ids=torch.arange(batch) // group_size,
        values=torch.randn(batch, width),
        turn_rewards=rewards,
        turn_states=states,
    )


def time_estimators(repeats: int) -> None:
    inputs, settings = estimator_inputs(), AdvantageSettings()
    shape = tuple(inputs.response_mask.shape)
    timings = {}
    for name in ADVANTAGE_ESTIMATORS:
        compute_advantages(name, inputs, settings)  # warm-up
        runs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            compute_advantages(name, inputs, settings)
            runs.append(time.perf_counter() - t0)
        timings[name] = statistics.median(runs)
    print(
        f"advantage estimators on a {shape[0]} x {shape[1]} batch of 8-turn trajectories (median of {repeats}, "
        f"{torch.get_num_threads()} threads):"
    )
    for name, seconds in timings.items():
        verdict = "ok" if seconds < 0.2 else "OVER the 0.2 s target"
        print(f"  {name:13s} {seconds * 1000:8.1f} ms  ({seconds / timings['gae']:.2f} x gae)  {verdict}")


@contextlib.contextmanager
def scoring_pass_apart():
    """The learner scoring the batch in a no-gradient pass of its own before the step, as it must for a batch
    trained in several steps (or in micro-batches with a critic), instead of reusing the step's forward passes."""
    single = StarPOTorchLearner.__dict__["_step_scores_itself"]  # the staticmethod itself, to put back
    StarPOTorchLearner._step_scores_itself = staticmethod(lambda *args: False)
    try:
        yield
    finally:
        StarPOTorchLearner._step_scores_itself = single


def build_with_one_rollout(config):
    """The algorithm, one rollout of ``config.num_groups`` groups played by its local env runner (sample seed 0),
    and that rollout as the learner's batch columns."""
    algo = config.build_algo()
    runner = algo.env_runner
    trajectories = runner.sample(
        seeds=list(range(config.num_groups)),
        group_size=config.group_size,
        sampling=config.sampling_params(),
        sample_seed=0,
    )
    columns, _ = prepare_update_batch(trajectories, config, runner.tokenizer.pad_token_id)
    return algo, trajectories, columns


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _update_footprint(lora: dict | None, args, queue) -> None:
    """In a fresh process: build StarPO on SmolLM2 (full or LoRA), play one fixed rollout, time the updates."""
    import hashlib
    import resource
    import tempfile
    import threading

    torch.set_num_threads(args.threads)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    config = (
        StarPOConfig()
        .environment("rllib_ragen/Bandit-v0")
        .rl_module(model_config={"model": "smollm2-135m", "lora": lora})
        .training(
            num_groups=args.groups,
            group_size=args.group_size,
            max_turns=1,
            rollout_filter="none",
            advantage_estimator="grpo",
            max_new_tokens_per_turn=args.max_new_tokens,
            lr=1e-5,
            validation_interval=0,
            micro_batch_size=args.micro_batch_size,
        )
        .debugging(seed=0)
    )
    algo, trajectories, columns = build_with_one_rollout(config)
    batch = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=len(trajectories))
    module = algo.learner_group._learner.module[DEFAULT_MODULE_ID]
    trained = sum(p.numel() for p in module.parameters() if p.requires_grad)

    before, peak, stop = _rss_bytes(), [0], threading.Event()

    def watch():  # the rise of resident memory during the updates: gradients, optimizer state, activations
        while not stop.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            stop.wait(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    seconds, apart = [], []
    for repeat in range(args.repeats + 1):  # the first update also allocates AdamW's state: timed apart
        t0 = time.perf_counter()
        algo.learner_group.update(batch=batch)
        seconds.append(time.perf_counter() - t0)
        if repeat:  # interleaved, so that noise hits both alike
            with scoring_pass_apart():
                t0 = time.perf_counter()
                algo.learner_group.update(batch=batch)
                apart.append(time.perf_counter() - t0)
    stop.set()
    watcher.join()
    with tempfile.TemporaryDirectory() as folder:
        algo.save_to_path(folder + "/checkpoint")
        checkpoint = sum(f.stat().st_size for f in pathlib.Path(folder).rglob("*") if f.is_file())
    algo.stop()
    ray.shutdown()
    queue.put(
        {
            "tokens": int(columns["attention_mask"].sum()),
            "trained": trained,
            "batch": hashlib.sha1(columns["input_ids"].tobytes()).hexdigest()[:12],
            "first_s": seconds[0],
            "update_s": statistics.median(seconds[1:]),
            "apart_s": statistics.median(apart),
            "rise_mib": (peak[0] - before) / 2**20,
            "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "checkpoint_mib": checkpoint / 2**20,
        }
    )


def compare_full_and_lora(args) -> None:
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # a fresh process each: peak memory is that side's alone
    lora = {"r": args.lora_rank, "alpha": 2 * args.lora_rank, "target_modules": "all-linear"}
    results = {}
    for name, setting in (("full", None), ("lora", lora)):
        queue = context.Queue()
        process = context.Process(target=_update_footprint, args=(setting, args, queue))
        process.start()
        results[name] = queue.get()
        process.join()
    full, low = results["full"], results["lora"]
    if full["batch"] != low["batch"]:
        raise SystemExit("the two sides played different rollouts; the comparison would not be like for like")
    print(
        f"SmolLM2-135M, {args.groups * args.group_size} bandit episodes, {full['tokens']} tokens per update, "
        f"GRPO, {args.threads} threads, median of {args.repeats} updates after the first"
    )
    print(f"{'':22s} {'full fine-tuning':>18s} {'LoRA r=' + str(args.lora_rank):>18s} {'LoRA / full':>12s}")
    rows = [
        ("trained parameters", "trained", "{:,.0f}"),
        ("first update, s", "first_s", "{:.2f}"),
        ("seconds per update", "update_s", "{:.2f}"),
        ("  scoring pass apart", "apart_s", "{:.2f}"),
        ("memory rise in updates, MiB", "rise_mib", "{:.0f}"),
        ("process peak RSS, MiB", "peak_mib", "{:.0f}"),
        ("checkpoint, MiB", "checkpoint_mib", "{:.1f}"),
    ]
    for label, key, fmt in rows:
        print(f"{label:28s} {fmt.format(full[key]):>12s} {fmt.format(low[key]):>18s} {low[key] / full[key]:>12.3f}")
    print(
        f"reading the batch once is {full['apart_s'] / full['update_s']:.2f}x faster (full), "
        f"{low['apart_s'] / low['update_s']:.2f}x (LoRA)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--estimators-only", action="store_true", help="time the advantage estimators only")
    parser.add_argument(
        "--full-vs-lora",
        action="store_true",
        help="SmolLM2-135M: full fine-tuning against LoRA (memory, seconds, checkpoint size)",
    )
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--micro-batch-size", type=int, default=None)
    args = parser.parse_args()
    if args.full_vs_lora:
        compare_full_and_lora(args)
        return
    torch.set_num_threads(args.threads)
    time_estimators(args.repeats)
    if args.estimators_only:
        return
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    # Filter off and one minibatch: the whole rollout batch is one optimizer step on both sides.
    config = (
        StarPOConfig()
        .environment("rllib_ragen/Sokoban-v0")
        .rl_module(model_config={"model": args.model})
        .training(
            num_groups=args.groups,
            group_size=args.group_size,
            rollout_filter="none",
            max_new_tokens_per_turn=args.max_new_tokens,
            lr=1e-4,
            critic_lr=1e-4,
            validation_interval=0,
        )
        .debugging(seed=0)
    )
    algo, trajectories, columns = build_with_one_rollout(config)
    tokens = int(columns["attention_mask"].sum())
    bare = BareLoop(algo.learner_group._learner.module[DEFAULT_MODULE_ID].policy, config)
    bare_batch = {k: torch.as_tensor(v) for k, v in columns.items()}

    def starpo_update(scoring_pass: bool = False) -> float:
        """One learner update; ``scoring_pass``: score in a no-gradient pass of its own first."""
        with scoring_pass_apart() if scoring_pass else contextlib.nullcontext():
            result = algo.learner_group.update(
                batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=len(trajectories))
            )
        return float(result[0][DEFAULT_MODULE_ID]["total_loss"].peek())  # one result per learner

    # Same weights, same batch: the first losses must agree, or the comparison is not like for like.
    first_starpo, first_bare = starpo_update(), bare.update(bare_batch)
    print(f"first-step loss: StarPO learner {first_starpo:.6f}, bare loop {first_bare:.6f}")
    if abs(first_starpo - first_bare) > 1e-4 * max(1.0, abs(first_bare)):
        raise SystemExit("the two updates compute different losses; the timing below would not compare like for like")

    timings = {"starpo": [], "bare": [], "scoring pass": []}
    sides = [
        ("starpo", starpo_update),
        ("bare", lambda: bare.update(bare_batch)),
        ("scoring pass", lambda: starpo_update(scoring_pass=True)),
    ]
    for repeat in range(args.repeats):  # interleaved, first side alternating: noise and order hit both alike
        for name, update in sides if repeat % 2 == 0 else sides[::-1]:
            t0 = time.perf_counter()
            update()
            timings[name].append(time.perf_counter() - t0)
    starpo, bare_s = statistics.median(timings["starpo"]), statistics.median(timings["bare"])
    two_pass = statistics.median(timings["scoring pass"])
    print(f"batch: {len(trajectories)} trajectories, {tokens} tokens, model {args.model}, {args.threads} threads")
    print(f"StarPO learner update : {starpo * 1000:8.1f} ms  ({tokens / starpo:,.0f} tokens/s)")
    print(f"bare PyTorch loop     : {bare_s * 1000:8.1f} ms  ({tokens / bare_s:,.0f} tokens/s)")
    print(f"overhead ratio        : {starpo / bare_s:.3f}  (target < 1.15; median of {args.repeats})")
    print(
        f"learner, scoring pass apart: {two_pass * 1000:8.1f} ms; reading the batch once is {two_pass / starpo:.2f}x "
        f"faster (median of {args.repeats})"
    )
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
