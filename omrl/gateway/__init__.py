"""Train the agents people already have: an OpenAI-compatible endpoint that records every call.

An agent program (a Python callable, or any command) talks to omrl's policy through an
OpenAI-compatible endpoint on loopback, unmodified; every call lands in its episode token-exactly.

- :mod:`omrl.gateway.messages`: a request's messages in one shape, laid out for the chat template;
- :mod:`omrl.gateway.recorder`: one episode's rows, continued or restarted per call;
- :mod:`omrl.gateway.batcher`: many agents' calls in shared generate calls;
- :mod:`omrl.gateway.protocol`: the Chat Completions wire format;
- :mod:`omrl.gateway.responses`: the Responses API, served as Chat Completions underneath;
- :mod:`omrl.gateway.server`: the endpoint and its per-episode keys;
- :mod:`omrl.gateway.endpoint`: its HTTP side: each request read, answered, and its reply's delivery told;
- :mod:`omrl.gateway.agents`: agent callables and commands, reward functions, their time limits;
- :mod:`omrl.gateway.play`: episodes of tasks played and scored (the agent counterpart of the rollout loop).
"""
