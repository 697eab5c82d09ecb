"""Agents written with real frameworks from PyPI, each as its own docs show, asking 6 x 7 with a multiply tool.

Each is ``run(task, base_url, api_key)``: omrl's agent signature, so ``--agent tests.gateway.frameworks:<name>``
runs it as it is.
"""

from __future__ import annotations

QUESTION_KEY = "prompt"


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: first factor
        b: second factor
    """
    return a * b


def openai_agents(task, base_url, api_key):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    model = OpenAIChatCompletionsModel(
        model="policy", openai_client=AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    )
    agent = Agent(
        name="calc", instructions="You are a calculator. Use tools.", tools=[function_tool(multiply)], model=model
    )
    return Runner.run_sync(agent, task[QUESTION_KEY]).final_output


def langgraph(task, base_url, api_key):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent  # LangGraph 1.x's prebuilt ReAct graph

    llm = ChatOpenAI(base_url=base_url, api_key=api_key, model="policy", max_retries=0)
    agent = create_react_agent(llm, [tool(multiply)], prompt="You are a calculator. Use tools.")
    out = agent.invoke({"messages": [{"role": "user", "content": task[QUESTION_KEY]}]})
    return out["messages"][-1].content


def langgraph_streaming(task, base_url, api_key):
    """The same graph on a streaming model (``stream: true`` on every call)."""
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent  # LangGraph 1.x's prebuilt ReAct graph

    llm = ChatOpenAI(
        base_url=base_url, api_key=api_key, model="policy", max_retries=0, streaming=True, stream_usage=True
    )
    agent = create_react_agent(llm, [tool(multiply)], prompt="You are a calculator. Use tools.")
    out = agent.invoke({"messages": [{"role": "user", "content": task[QUESTION_KEY]}]})
    return out["messages"][-1].content


def pydantic_ai(task, base_url, api_key):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("policy", provider=OpenAIProvider(base_url=base_url, api_key=api_key))
    agent = Agent(model, instructions="You are a calculator. Use tools.", tools=[multiply])
    return agent.run_sync(task[QUESTION_KEY]).output


def smolagents(task, base_url, api_key):
    from smolagents import OpenAIServerModel, ToolCallingAgent, tool

    model = OpenAIServerModel(model_id="policy", api_base=base_url, api_key=api_key, client_kwargs={"max_retries": 0})
    agent = ToolCallingAgent(tools=[tool(multiply)], model=model, max_steps=4, verbosity_level=0)
    return agent.run(task[QUESTION_KEY])


def openai_agents_default(task, base_url, api_key):
    """The Agents SDK on its default model, which speaks the Responses API, given a client of its own
    (omrl plays episodes at once on threads of one process: never a process-wide default client)."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="policy", openai_client=AsyncOpenAI(base_url=base_url, api_key=api_key))
    agent = Agent(
        name="calc", instructions="You are a calculator. Use tools.", tools=[function_tool(multiply)], model=model
    )
    return Runner.run_sync(agent, task[QUESTION_KEY]).final_output


def openai_agents_capped(task, base_url, api_key):
    """The same, with a max_tokens of the agent's own (its ModelSettings): the SDK raises on a reply cut there."""
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="policy", openai_client=AsyncOpenAI(base_url=base_url, api_key=api_key))
    agent = Agent(name="calc", instructions="Answer.", model=model, model_settings=ModelSettings(max_tokens=8))
    return Runner.run_sync(agent, task[QUESTION_KEY]).final_output


def openai_agents_streamed(task, base_url, api_key):
    """The same, streamed (``Runner.run_streamed``: Responses events)."""
    import asyncio

    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    model = OpenAIResponsesModel(model="policy", openai_client=AsyncOpenAI(base_url=base_url, api_key=api_key))
    agent = Agent(
        name="calc", instructions="You are a calculator. Use tools.", tools=[function_tool(multiply)], model=model
    )

    async def main():
        run = Runner.run_streamed(agent, task[QUESTION_KEY])
        async for _ in run.stream_events():
            pass
        return run.final_output

    return asyncio.run(main())


#: the agents of a test's episodes that wait for one another (set by the test), so each sets the global
#: client before any calls: then every call goes to the key set last, as episodes played at once do
TOGETHER: list = []


def openai_agents_global(task, base_url, api_key):
    """The Agents SDK pointed at omrl with ``set_default_openai_client``: a process-wide client, which
    every episode's agent sets at once. Never point omrl's agents at a global client: the run fails."""
    from agents import Agent, Runner, set_default_openai_client, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    set_default_openai_client(AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0), use_for_tracing=False)
    for barrier in TOGETHER:
        barrier.wait()
    agent = Agent(name="calc", instructions="Answer with a number.", model="policy")
    return Runner.run_sync(agent, task[QUESTION_KEY]).final_output
