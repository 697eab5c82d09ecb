"""Built-in scorers: how good a search node looks. ``fn(nodes, ctx, **options) -> list[float]``, higher is better."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import replace
from typing import Sequence

from omrl.chat import prompt_ids
from omrl.errors import ConfigError
from omrl.search import Node, SearchContext
from omrl.search.context import yes_or_no
from omrl_plugins.rewards.reward_model import load_reward_model

SELF_EVAL_QUESTION = "Is the agent on track to complete the task? Answer with one word: yes or no."
EXCERPT = 400  # characters kept of each message in the self-evaluation transcript


def env_reward(nodes: Sequence[Node], ctx: SearchContext, partial_credit: bool = False) -> list[float]:
    """The env's rewards summed along each path; ``partial_credit`` adds the env's latest ``score``.

    Most envs reward only the end (0 until then), so open nodes tie and searches keep
    their earlier samples; ``partial_credit`` uses what an env says about progress
    (gridworld's comes from its shortest-path oracle: a privileged signal).
    """
    yes_or_no("scorer 'env_reward'", "partial_credit", partial_credit)
    return [node.returns + (node.episode.score if partial_credit else 0.0) for node in nodes]


def logprob(nodes: Sequence[Node], ctx: SearchContext) -> list[float]:
    """The model's own confidence: exp(mean log-prob of every token it generated on the path), in (0, 1]."""
    out = []
    for node in nodes:
        ep = node.episode
        generated = [lp for lp, mask in zip(ep.logprobs, ep.loss_mask) if mask]
        out.append(math.exp(sum(generated) / len(generated)) if generated else 1.0)
    return out


def self_eval(
    nodes: Sequence[Node], ctx: SearchContext, question: str = SELF_EVAL_QUESTION, max_new_tokens: int = 4
) -> list[float]:
    """The model asked whether the path is on track (ToT's state evaluation): its probability of "yes".

    Each node's chat (after the worked example) is shown as a transcript, then
    ``question``; the model answers greedily in one batched call whose tokens count
    against each tree's budget. The score is p("yes") when it answers yes, 1 - p("no")
    when it answers no, and 0.5 when it says neither or the budget is spent.
    """
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ConfigError(f"self_eval option max_new_tokens={max_new_tokens!r} is invalid; valid: a whole number >= 1")
    prompts = [prompt_ids(ctx.tokenizer, _judge_messages(node, question)) for node in nodes]
    replies = ctx.generate(nodes, prompts, max_new_tokens, temperature=0.0)
    scores = []
    for reply in replies:
        if reply is None or not reply.token_ids:
            scores.append(0.5)
            continue
        word = ctx.tokenizer.decode(reply.token_ids, skip_special_tokens=True).strip().lower()
        p = math.exp(reply.logprobs[0])  # greedy: the model's own probability of its first token
        scores.append(p if word.startswith("yes") else 1.0 - p if word.startswith("no") else 0.5)
    return scores


def _judge_messages(node: Node, question: str) -> list[dict[str, str]]:
    """A fresh two-message chat: the task and the path so far as a transcript, then the question."""
    chat = node.messages[1 + node.episode.demo_messages :]  # after the system prompt and the worked example
    lines = [f"Task: {node.episode.instruction}"]
    for message in chat:
        who = "Agent" if message["role"] == "assistant" else "Environment"
        lines.append(f"{who}: {message['content'][:EXCERPT]}")
    return [
        {"role": "system", "content": "You judge how well an agent is doing at a task."},
        {"role": "user", "content": "\n".join(lines) + f"\n\n{question}"},
    ]


def reward_model(
    nodes: Sequence[Node], ctx: SearchContext, path: str = "", text: bool = False, device: str = "cpu"
) -> list[float]:
    """A trained reward model's score of each node's path (options in ``plugins.rm``, shared with the reward).

    An ``orm`` scores the path as a whole, a ``prm`` its last turn. The node's token ids
    are scored as they are (an open node's end with the next turn's generation prompt),
    so the policy's tokenizer must be the reward model's; ``text`` re-encodes the chat
    with the reward model's own tokenizer instead.
    """
    model = load_reward_model(path, text, device, what="scorer 'rm'")
    if text:  # an open node's chat is on the node, not yet on its episode
        episodes = [replace(node.episode, messages=node.messages or node.episode.messages) for node in nodes]
        return model.score_episodes(episodes, text=True)
    return model.score_episodes([node.episode for node in nodes], policy_tokenizer=ctx.tokenizer)


def random_pick(nodes: Sequence[Node], ctx: SearchContext) -> list[float]:
    """A random number per node: ``best_of_n(select=random)`` picks a leaf uniformly at random, the
    baseline a selector must beat. Each node's number depends only on the run's seed, its task and its
    node id, so a run is reproducible however the runner batches its trees."""
    return [random.Random(f"{ctx.seed}/{_task(node)}/{node.id}").random() for node in nodes]


def majority_vote(nodes: Sequence[Node], ctx: SearchContext) -> list[float]:
    """Self-consistency: the share of a tree's candidates (among ``nodes``) whose last action is this node's.

    The most common final action wins (``best_of_n`` keeps the first on ties); a node
    without a parsed action scores 0.
    """
    actions = [_last_action(node) for node in nodes]
    trees = [id(node.tree) for node in nodes]
    counts = Counter(zip(trees, actions))
    sizes = Counter(trees)
    return [counts[(tree, action)] / sizes[tree] if action is not None else 0.0 for tree, action in zip(trees, actions)]


def _task(node: Node) -> int:
    return node.tree.task_id if node.tree is not None else node.episode.task_id


def _last_action(node: Node) -> str | None:
    turns = node.episode.turns
    action = turns[-1].action if turns else None
    return " ".join(action.split()) if action is not None else None
