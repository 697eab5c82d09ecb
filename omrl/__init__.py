"""omrl: train LLM agents with reinforcement learning in multi-turn environments."""

__version__ = "0.1.0"
