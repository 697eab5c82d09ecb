"""SFT on episodes recorded through the gateway trains the very ids the model sampled in them."""

from omrl.chat import conversation_rows
from omrl.data.trajectory import Episode
from tests.fakes import ScriptedBackend
from tests.gateway.agents import tool_loop
from tests.gateway.conftest import make_gateway

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'


def test_an_expert_episode_is_its_own_sft_row(smollm2_tokenizer):
    """SmolLM2's template renders no tools: the gateway describes them in the system message, writes the
    call as the text sampled and the result as a user message; the episode's messages say the same, so
    SFT's layout of them is the recorded row, id for id, mask for mask."""
    tokenizer = smollm2_tokenizer

    def expert(call, index, prompt):
        return "The answer is 42." if "<tool_response>" in tokenizer.decode(prompt) else f"Let me compute.\n{CALL}"

    gateway, _ = make_gateway(tokenizer, ScriptedBackend(tokenizer, expert))
    try:
        ep = Episode(env="agent", task_id=0, split="train", instruction="")
        key, recorder = gateway.open(ep)
        assert tool_loop({"prompt": "What is 6 times 7?"}, gateway.base_url, key) == "The answer is 42."
        gateway.end(key)
    finally:
        gateway.close()
    assert not gateway.layout.renders_tools and ep.row_starts == [] and len(ep.turns) == 2
    messages = recorder.chat()
    assert "multiply" in messages[0]["content"] and messages[2]["content"] == f"Let me compute.\n{CALL}"
    ((ids, mask),) = conversation_rows(tokenizer, messages)
    assert ids == ep.token_ids
    assert mask == ep.loss_mask
