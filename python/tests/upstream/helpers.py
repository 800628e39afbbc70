# Vendored from the openai-agents 0.24.0 sdist (pinned in requirements-test.txt), tests/memory/test_session.py and tests/test_responses.py (helpers).
# Copyright (c) 2025 OpenAI, MIT License: see LICENSE-openai-agents beside this file.
# Changes: only the tests named in conftest.py's VENDORED list were kept, with the helpers
# they use from tests/memory/test_session.py and tests/test_responses.py; imports point
# here; `SQLiteSession` is swapped for the ctxlog adapter by conftest.py. Test bodies are
# as released.

import asyncio

from openai.types.responses import ResponseOutputItem, ResponseOutputMessage, ResponseOutputText

from agents import Runner


def get_text_message(content: str) -> ResponseOutputItem:
    return ResponseOutputMessage(
        id="1",
        type="message",
        role="assistant",
        content=[ResponseOutputText(text=content, type="output_text", annotations=[], logprobs=[])],
        status="completed",
    )



def _run_sync_wrapper(agent, input_data, **kwargs):
    """Wrapper for run_sync that properly sets up an event loop."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return Runner.run_sync(agent, input_data, **kwargs)
    finally:
        loop.close()


async def run_agent_async(runner_method: str, agent, input_data, **kwargs):
    """Helper function to run agent with different methods."""
    if runner_method == "run":
        return await Runner.run(agent, input_data, **kwargs)
    elif runner_method == "run_sync":
        # For run_sync, we need to run it in a thread with its own event loop
        return await asyncio.to_thread(_run_sync_wrapper, agent, input_data, **kwargs)
    elif runner_method == "run_streamed":
        result = Runner.run_streamed(agent, input_data, **kwargs)
        # For streaming, we first try to get at least one event to trigger any early exceptions
        # If there's an exception in setup (like memory validation), it will be raised here
        try:
            first_event = None
            async for event in result.stream_events():
                if first_event is None:
                    first_event = event
                # Continue consuming all events
                pass
        except Exception:
            # If an exception occurs during streaming, we let it propagate up
            raise
        return result
    else:
        raise ValueError(f"Unknown runner method: {runner_method}")

