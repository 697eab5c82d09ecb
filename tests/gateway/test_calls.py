"""Which replies of a call become turns: a retried call's reply that the client never got is none, the
choice of several that the agent goes on with is the one trained, and a seeded call samples as it would
alone however many calls wait beside it."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from omrl.backends.hf import HFBackend
from omrl.data.trajectory import Episode
from omrl.rollout.spec import RolloutLimits
from tests.fakes import ScriptedBackend
from tests.gateway.conftest import assert_token_exact, make_gateway

CHAT = [{"role": "user", "content": "hi"}]


def episode() -> Episode:
    return Episode(env="agent", task_id=0, split="train", instruction="")


def slow_first(tokenizer, seconds: float) -> ScriptedBackend:
    """Its first generate call outlasts the client's timeout; every reply says which call made it."""

    def reply(call, index, prompt):
        if call == 0:
            time.sleep(seconds)
        return f"reply of call {call}"

    return ScriptedBackend(tokenizer, reply)


def slow_gateway(tokenizer, seconds: float):
    """A gateway whose first generate call takes ``seconds``, past the client's timeout (1 s), an episode
    and its recorder, and a client that retries ``retries`` times."""
    gateway, backend = make_gateway(tokenizer, slow_first(tokenizer, seconds))
    ep = episode()
    key, recorder = gateway.open(ep)

    def client(retries: int) -> openai.OpenAI:
        return openai.OpenAI(base_url=gateway.base_url, api_key=key, timeout=1.0, max_retries=retries)

    return gateway, (backend, ep, recorder, client)


@pytest.fixture
def timing_out(tiny_tokenizer):
    """A first call of 1.5 s: the client times out at 1 s and retries after its backoff (0.375 to 0.5 s),
    about when the first call ends; the retry then has most of its own second to be answered in."""
    gateway, parts = slow_gateway(tiny_tokenizer, 1.5)
    yield parts
    gateway.close()


@pytest.fixture
def hung_up(tiny_tokenizer):
    """A first call of 3 s: the client has surely hung up when its reply is ready, on a loaded machine too."""
    gateway, parts = slow_gateway(tiny_tokenizer, 3.0)
    yield parts
    gateway.close()


def test_a_retried_call_replaces_the_reply_the_client_never_got(timing_out):
    """openai retries a call that timed out; the first call's reply, which it never read, is no turn."""
    backend, ep, _, client = timing_out
    got = client(1).chat.completions.create(model="m", messages=CHAT)
    assert got.choices[0].message.content == "reply of call 1"
    assert [turn.response for turn in ep.turns] == ["reply of call 1"]
    assert ep.row_starts == [] and len(backend.served) == 2
    assert_token_exact(ep, backend)


def test_a_call_asked_again_after_its_reply_arrived_is_another_sample_and_both_are_trained(tiny_tokenizer):
    """Self-consistency: an agent asks the same chat three times and reads every reply. No client says it
    retries (openai's x-stainless-retry-count is 0), so none replaces another: each is a row of its own."""
    gateway, backend = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda c, i, p: f"sample {c}"))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        got = [client.chat.completions.create(model="m", messages=CHAT).choices[0].message.content for _ in range(3)]
        assert got == ["sample 0", "sample 1", "sample 2"]
        assert [turn.response for turn in ep.turns] == got and len(ep.rows()) == 3
        assert_token_exact(ep, backend)
    finally:
        gateway.close()


@pytest.mark.slow  # waits out a deadline of seconds
def test_a_reply_the_client_hung_up_on_is_no_turn(hung_up):
    backend, ep, recorder, client = hung_up
    with pytest.raises(openai.APITimeoutError):
        client(0).chat.completions.create(model="m", messages=CHAT)
    deadline = time.monotonic() + 15
    # it answers after the client left, then undoes the call: the recorder's last call is none again (a
    # reply served but not yet recorded leaves no turn either, so ep.turns alone cannot tell the end)
    while not (backend.served and recorder.last is None) and time.monotonic() < deadline:
        time.sleep(0.05)
    with recorder.lock:
        assert len(backend.served) == 1
        assert ep.turns == [] and sum(ep.loss_mask) == 0 and recorder.calls == 0
    again = [*CHAT, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "and?"}]
    client(0).chat.completions.create(model="m", messages=again)  # a chat it never answered: a first call
    assert len(ep.turns) == 1 and ep.row_starts == []
    assert_token_exact(ep, backend)


def test_the_choice_the_agent_goes_on_with_is_the_one_trained(tiny_tokenizer):
    gateway, backend = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda c, i, p: f"choice {c}.{i}"))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        three = client.chat.completions.create(model="m", messages=CHAT, n=3)
        first, chosen, last = [c.message.content for c in three.choices]
        assert len({first, chosen, last}) == 3
        echo = three.choices[1].message.model_dump(exclude_none=True)
        again = client.chat.completions.create(model="m", messages=[*CHAT, echo, {"role": "user", "content": "more"}])
        assert [turn.response for turn in ep.turns] == [chosen, again.choices[0].message.content]
        assert ep.row_starts == []  # the chat continued the chosen reply's row
        trained = tiny_tokenizer.decode([t for t, m in zip(ep.token_ids, ep.loss_mask) if m])
        assert first not in trained and last not in trained  # the unused choices get no loss
        assert_token_exact(ep, backend)
    finally:
        gateway.close()


@pytest.mark.slow
def test_a_seeded_call_samples_as_alone_beside_others_with_its_seed(tiny_tokenizer, tiny_hf):
    """docs/agents.md: the same seed and chat give the same reply, also when several such calls wait together."""
    model, _ = tiny_hf
    gateway, backend = make_gateway(
        tiny_tokenizer,
        HFBackend(model, tiny_tokenizer),
        honor_sampling=True,
        window_s=2.0,
        limits=RolloutLimits(max_new_tokens=12, max_context=1024),
    )
    chat = [{"role": "user", "content": "Tell me a story"}]
    try:
        clients = [openai.OpenAI(base_url=gateway.base_url, api_key=gateway.open(episode())[0]) for _ in range(4)]

        def ask(client):
            return client.chat.completions.create(model="m", messages=chat, seed=7, temperature=1.0).choices[0]

        alone = ask(clients[0]).message.content
        replies, barrier = {}, threading.Barrier(3)

        def together(index):
            barrier.wait()
            replies[index] = ask(clients[index + 1]).message.content

        threads = [threading.Thread(target=together, args=(i,)) for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert list(replies.values()) == [alone] * 3
        assert backend.calls == [1, 1, 1, 1]  # each in a generate call of its own
    finally:
        gateway.close()


def test_usage_counts_the_prompts_tokens_and_the_replys_apart(tiny_tokenizer):
    """An agent that compacts its chat by ``usage`` reads the prompt's own length, on the first row too."""
    from omrl.chat import prompt_ids

    gateway, backend = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda c, i, p: "a reply"))
    try:
        key, _ = gateway.open(episode())
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        usage = client.chat.completions.create(model="m", messages=CHAT).usage
        assert usage.prompt_tokens == len(prompt_ids(tiny_tokenizer, CHAT))
        assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    finally:
        gateway.close()


def test_a_retry_its_client_declares_replaces_the_last_reply(tiny_tokenizer):
    """A reply the client got while its connection broke after (the reply was written): the SDK's retry,
    which says so in x-stainless-retry-count, replaces it rather than add a second row."""
    gateway, backend = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, lambda c, i, p: f"sample {c}"))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        client.chat.completions.create(model="m", messages=CHAT)
        retry = {"x-stainless-retry-count": "1"}
        again = client.chat.completions.create(model="m", messages=CHAT, extra_headers=retry)
        assert [turn.response for turn in ep.turns] == [again.choices[0].message.content] == ["sample 1"]
        assert ep.row_starts == []
        assert_token_exact(ep, backend)
    finally:
        gateway.close()


def test_the_retry_of_an_undone_sample_keeps_the_reply_before_it(tiny_tokenizer):
    """Sample A is delivered; sample B of the same chat times out at the client and is undone; the SDK's
    retry of B (declared) is a first call: A, which the agent got, stays a turn."""

    def reply(call, index, prompt):
        if call == 1:
            time.sleep(1.5)  # B outlasts the client's 1 s timeout
        return f"reply of call {call}"

    gateway, backend = make_gateway(tiny_tokenizer, ScriptedBackend(tiny_tokenizer, reply))
    try:
        ep = episode()
        key, _ = gateway.open(ep)
        first = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
        assert first.chat.completions.create(model="m", messages=CHAT).choices[0].message.content == "reply of call 0"
        patient = openai.OpenAI(base_url=gateway.base_url, api_key=key, timeout=1.0, max_retries=1)
        assert patient.chat.completions.create(model="m", messages=CHAT).choices[0].message.content == "reply of call 2"
        assert [turn.response for turn in ep.turns] == ["reply of call 0", "reply of call 2"]
        assert len(ep.rows()) == 2
        assert_token_exact(ep, backend)
    finally:
        gateway.close()
