"""omrl learns by self-play: the `tiny` model on TextArena's Kuhn Poker (or TicTacToe), through SFT on
the rules player's games and then GRPO with the policy at both seats.

    python examples/learn_selfplay.py                    # Kuhn Poker, the full run (about 15 minutes on 2 busy CPU cores)
    python examples/learn_selfplay.py --game tictactoe   # TicTacToe (about 25 minutes; the target is missed there)
    python examples/learn_selfplay.py --quick            # the same stages at a small budget (a minute or two)

Stages, each written under ``--out`` and skipped when its result is there:

1. EXPERT: the env's scripted ``rules`` player (Kuhn Poker: bet or call a king, check or fold a jack,
   check or call a queen; TicTacToe: win, block, centre, corner) plays both seats of ``expert_games``
   training games as the expert (``omrl rollout --expert``): every seat's chat is SFT data.
2. SFT of the random-init `tiny` on those games.
3. GRPO in self-play from the SFT model: the policy sits at both seats, each seat rewarded +1/-1/0 for
   a win, loss or draw (``process``, less ``invalid_penalty`` for a move the game refused), advantages
   per (game setup, seat).
4. EVAL of the SFT model and the self-play model against the ``random`` scripted player, which neither
   ever played: ``eval_games`` held-out games at each seat (seeds of the test split), sampled at
   temperature 1 (the policy GRPO optimises). A game is a win or not; the win rate's standard error
   is over games. Both models play the same seeds at the same seats, so the gain's standard error is
   the paired one (over games, of one model's win minus the other's); the unpaired one is kept too.

``summary.json`` holds every number; docs/learning.md has the measured runs.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from omrl.config import load_config
from omrl.config.options import EvalRunConfig, RolloutRunConfig, SftRunConfig, TrainRunConfig
from omrl.data import write_episodes
from omrl.rollout import PlaySpec, RolloutSession
from omrl.training.rl import run_rl
from omrl.training.sft import run_sft

sys.path.insert(0, str(Path(__file__).resolve().parent))  # common.py beside this file
from common import grpo_settings, sft_settings, stage, standard_error, write_summary  # noqa: E402

GENERATION = ["generation.max_new_tokens=8", "generation.max_context=2048", "generation.batch_size=64"]
SEATS = ("player_0", "player_1")


@dataclass
class Budget:
    """How much work each stage does, and the SFT and GRPO settings."""

    expert_games: int  # the rules player against itself: two episodes (one a seat) a game
    sft_epochs: float
    grpo_steps: int
    eval_games: int  # held-out games per seat and model
    game: str  # a textarena-duel game
    tasks_per_step: int = 8  # games set up per step, each played group_size times
    group_size: int = 4
    model: str = "tiny"  # what SFT starts from (random init)
    sft_learning_rate: float = 3e-3
    grpo_learning_rate: float = 5e-4
    invalid_penalty: float = 0.5  # per move the game refused: the SFT model's usual way to lose
    micro_batch_size: int = 16
    mini_batch_size: int = 8  # episodes per GRPO optimizer step
    sft_warmup_steps: int = 20
    ppo_epochs: int = 1
    kl_coef: float = 0.0


# Kuhn Poker (3 rounds): short chats (about 500 tokens a seat), four possible moves
KUHN = Budget(
    expert_games=800, sft_epochs=3.0, grpo_steps=30, eval_games=200, grpo_learning_rate=1e-4, game="KuhnPoker-v0"
)
# TicTacToe: chats of about 1,150 tokens; the target is missed here (docs/learning.md)
TICTACTOE = Budget(expert_games=150, sft_epochs=2.0, grpo_steps=14, eval_games=100, game="TicTacToe-v0")
BUDGETS = {"kuhn": KUHN, "tictactoe": TICTACTOE}
# its 2 SFT steps take no warm-up, and its 4 episodes a step make one mini-batch
QUICK = replace(
    KUHN,
    expert_games=16,
    sft_epochs=1.0,
    grpo_steps=1,
    tasks_per_step=2,
    group_size=2,
    eval_games=4,
    sft_warmup_steps=0,
    mini_batch_size=4,
)


def env_name(budget: Budget) -> str:
    return f"textarena-duel:{budget.game}"


def env_settings(budget: Budget) -> list[str]:
    # a game ends by its own rules well within 20 moves (a seat's second refused move in a row loses it)
    return [f"env.name={env_name(budget)}", "env.template=react", "env.max_turns=20", "env.demonstration=false"]


def expert_data(path: Path, budget: Budget) -> Path:
    """The ``rules`` player at both seats of ``budget.expert_games`` training games, as the expert; its chats
    are the SFT data."""
    settings = ["model.name=tiny", *env_settings(budget), *GENERATION, f"plugins.{env_name(budget)}.opponent=rules"]
    cfg = load_config(RolloutRunConfig, None, settings)
    with RolloutSession.from_config(cfg, expert=True) as session:
        tasks = session.task_ids("train", budget.expert_games)
        played = session.play(tasks, PlaySpec(split="train", expert=True))
    write_episodes(played.episodes, path)
    return path


def sft_stage(data: Path, out: Path, budget: Budget, seed: int) -> Path:
    """SFT of ``budget.model`` on the expert's moves (its chats run to about 1,200 tokens)."""
    settings = [
        s
        for s in sft_settings(out, budget, seed, data, warmup_steps=budget.sft_warmup_steps)
        if not s.startswith("max_seq")
    ]
    run_sft(load_config(SftRunConfig, None, [*settings, "max_seq_length=2048"]))
    return out


def grpo_stage(model: Path, out: Path, budget: Budget, seed: int) -> Path:
    """GRPO in self-play from ``model``: the policy at both seats (the ``seats`` default)."""
    run_rl(
        load_config(
            TrainRunConfig,
            "grpo",
            [
                f"model.name={model}",
                "model.gradient_checkpointing=false",  # a 1M-parameter model: recomputing costs more than it saves
                *env_settings(budget),
                *GENERATION,
                *grpo_settings(out, budget, seed, reward="{process: 1.0}"),
                f"plugins.process.invalid_penalty={budget.invalid_penalty}",
                f"mini_batch_size={budget.mini_batch_size}",
                f"ppo_epochs={budget.ppo_epochs}",
                "eval_every=0",
                "eval_tasks=1",
            ],
        )
    )
    return out


def against_random(model: str, budget: Budget, seed: int) -> dict:
    """``model`` against the ``random`` scripted player: ``eval_games`` test games at each seat, sampled;
    its win, draw and loss rates, the win rate's standard error, the share of its moves refused and each
    game's win (``per_game``: ``<seat>:<task>`` -> 1 or 0, to pair two models' games)."""
    wins, outcomes, refused, moves = {}, {"win": 0, "draw": 0, "loss": 0, "unfinished": 0, "error": 0}, 0, 0
    for seat in SEATS:
        other = SEATS[1 - SEATS.index(seat)]
        cfg = load_config(
            EvalRunConfig,
            None,
            [
                f"model.name={model}",
                *env_settings(budget),
                *GENERATION,
                "generation.temperature=1.0",
                f"plugins.{env_name(budget)}.opponent=random",
                f"seats.play.{other}=scripted",
                f"seed={seed}",
            ],
        )
        with RolloutSession.from_config(cfg) as session:
            tasks = session.task_ids("test", budget.eval_games)
            episodes = session.play(tasks, PlaySpec(split="test", seed=seed)).episodes
        for ep in episodes:
            outcomes[ep.info["outcome"]] += 1
            wins[f"{seat}:{ep.task_id}"] = float(ep.info["outcome"] == "win")
            refused += sum(bool(t.info.get("invalid")) or t.action is None for t in ep.turns)
            moves += len(ep.turns)
    games = len(wins)
    return {
        "games": games,
        "win_rate": sum(wins.values()) / games,
        "win_rate_se": standard_error(list(wins.values())),
        **{f"{o}_rate": n / games for o, n in outcomes.items()},
        "refused_move_rate": refused / max(moves, 1),
        "per_game": wins,
    }


def main(out: Path, budget: Budget, seed: int = 0) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()

    # EXPERT games, SFT on them, then GRPO in self-play
    data = out / "expert.parquet"
    if not data.exists():
        expert_data(data, budget)
    if not (out / "sft" / "config.json").exists():
        sft_stage(data, out / "sft", budget, seed)
    if not (out / "grpo" / "config.json").exists():
        grpo_stage(out / "sft", out / "grpo", budget, seed)

    # EVAL: both models against the random player, which neither trained against
    def report(name: str, model: Path) -> dict:
        result = stage(out, f"eval_{name}", lambda: against_random(str(model), budget, seed))
        print(
            f"{name} vs random: win {result['win_rate']:.1%} +- {result['win_rate_se']:.1%} "
            f"(draw {result['draw_rate']:.1%}, loss {result['loss_rate']:.1%}, "
            f"moves refused {result['refused_move_rate']:.1%}) over {result['games']} games",
            flush=True,
        )
        return result

    sft, selfplay = report("sft", out / "sft"), report("selfplay", out / "grpo")
    gain = selfplay["win_rate"] - sft["win_rate"]
    # both models play the same seeds at the same seats: the paired error is over games, of each game's
    # win under one minus under the other; the unpaired one, sqrt(se_a^2 + se_b^2), is kept beside it
    paired = [selfplay["per_game"][g] - sft["per_game"][g] for g in sft["per_game"] if g in selfplay["per_game"]]
    se = standard_error(paired)
    unpaired = math.hypot(sft["win_rate_se"], selfplay["win_rate_se"])
    summary = {
        "env": env_name(budget),
        "opponent_in_eval": "random",
        "budget": asdict(budget),
        "seed": seed,
        "sft": sft,
        "selfplay": selfplay,
        "win_rate_gain": gain,
        "win_rate_gain_se": se,
        "success_gain_in_se": gain / se if se else 0.0,
        "win_rate_gain_se_unpaired": unpaired,
        "success_gain_in_unpaired_se": gain / unpaired if unpaired else 0.0,
        "minutes": (time.perf_counter() - started) / 60,
    }
    return write_summary(out, summary, gain, "paired SE")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/learn-selfplay"))
    parser.add_argument("--game", choices=sorted(BUDGETS), default="kuhn", help="the game and its budget")
    parser.add_argument("--quick", action="store_true", help="the small budget the test suite uses (Kuhn Poker)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.out, QUICK if args.quick else BUDGETS[args.game], args.seed)
