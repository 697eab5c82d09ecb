"""``omrl check-template`` and :func:`omrl.chat.probe.check_template` on real tokenizers: the tiny model's
append-only ChatML, the three thinking-model fixture templates, and templates that break a history mode."""

from __future__ import annotations

import io
import shutil
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from omrl.chat.probe import (
    EMPTY_BLOCK,
    END_TOKEN,
    IDS_CHANGED,
    REASONING_DROPPED,
    REPLY_DROPPED,
    TOOL_CALLS,
    TURNS,
    WHITESPACE,
    check_template,
)
from omrl.cli import main
from omrl.errors import OmrlError
from omrl.models import load_tokenizer
from tests.helpers import cli_exit

from .thinking import TEMPLATES, build_qwen3_like, chatml

# DeepSeek-R1-like, but a reply is closed by plain text: no special token where a sampled stop token could go,
# so keep (which renders after placeholders once the template rewrites) has no place for it
ENDS_IN_TEXT = chatml(r"""{{- '<|im_start|>assistant\n' + m.content.split('</think>')[-1].lstrip('\n') + 'END\n' -}}""")

# refuses any chat that goes on after a reply: no history mode can train it
RAISES_AFTER_REPLY = r"""
{%- for m in messages -%}
{%- if m.role == 'assistant' and not loop.last -%}{{- raise_exception('a reply must be the last message') -}}
{%- endif -%}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# renders only when given a kwarg, so --kwargs is seen to reach the template
NEEDS_KWARG = r"""
{%- if not ready -%}{{- raise_exception('pass ready') -}}{%- endif -%}
{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# one rewrite each, on the tiny tokenizer: the end token of the last reply (as gpt-oss's <|return|>), a space
# before it, structured tool calls written one way while last and another once a tool result follows
CHATML_END = "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
ONE_REWRITE = {
    END_TOKEN: "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content -}}"
    "{{- '<|endoftext|>' if m.role == 'assistant' and loop.last else '<|im_end|>\\n' -}}{%- endfor -%}",
    WHITESPACE: "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content -}}"
    "{{- ' ' if m.role == 'assistant' and loop.last else '' -}}{{- '<|im_end|>\\n' -}}{%- endfor -%}",
    TOOL_CALLS: "{%- for m in messages -%}{%- set last = loop.last -%}{{- '<|im_start|>' + m.role + '\\n' -}}"
    "{{- m.content or '' -}}{%- for c in m.tool_calls or [] -%}"
    "{{- '<tool_call>' + c.function.name + ('()' if last else '') + '</tool_call>' -}}{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}{%- endfor -%}",
}

# Qwen3's rule (earlier reasoning dropped, so keep renders after placeholders) and messages numbered: keep's
# placeholder chat is shorter than the real one, so its increments would carry the wrong numbers
NUMBERED = r"""
{%- set ns = namespace(last_user=-1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' and loop.index0 > ns.last_user and m.reasoning_content -%}
{{- '<|im_start|>assistant\n<think>\n' + m.reasoning_content + '\n</think>\n\n' + m.content + '<|im_end|>\n' -}}
{%- elif m.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' + m.content + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + m.role + ' (message ' + loop.index|string + ')\n' + m.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# ChatML without a generation prompt: the model would have to sample the assistant's header itself
NO_GENERATION_PROMPT = (
    "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
)

# ChatML that writes only the first user message: the model never sees an observation
FIRST_USER_ONLY = r"""
{%- set ns = namespace(users=0) -%}
{%- for m in messages -%}
{%- if m.role == 'user' -%}{%- set ns.users = ns.users + 1 -%}{%- endif -%}
{%- if m.role != 'user' or ns.users == 1 -%}{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

# Mistral-like: the user's turn closes with [/INST] and the answer follows it, so no generation prompt is needed
INST = (
    "{%- for m in messages -%}{%- if m.role == 'assistant' -%}{{- m.content + '<|im_end|>' -}}"
    "{%- else -%}{{- '[INST] ' + m.content + ' [/INST]' -}}{%- endif -%}{%- endfor -%}"
)

# the generation prompt names the speaker, the history does not: a sampled reply is not what the template writes
NAMED_PROMPT = (
    "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant (bob)\\n' -}}{%- endif -%}"
)

EXTRA = {
    "ends_in_text": ENDS_IN_TEXT,
    "raises_after_reply": RAISES_AFTER_REPLY,
    "needs_kwarg": NEEDS_KWARG,
    "numbered": NUMBERED,
    "no_generation_prompt": NO_GENERATION_PROMPT,
    "first_user_only": FIRST_USER_ONLY,
    "inst": INST,
    "named_prompt": NAMED_PROMPT,
}


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    """A tiny Qwen3 directory per template; drops_reasoning's under a long path, which must not wrap."""
    root = tmp_path_factory.mktemp("templates")
    long = root / ("a-directory-name-long-enough-to-pass-eighty-columns-" * 2)
    return {
        name: str(build_qwen3_like((long if name == "drops_reasoning" else root) / name, template))
        for name, template in {**TEMPLATES, **EXTRA}.items()
    }


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """``omrl check-template ARGS`` in-process, as the console script runs it: (exit status, stdout, stderr)."""
    return cli_exit(capsys, "check-template", *args)


@pytest.mark.parametrize("finding", list(ONE_REWRITE))
def test_each_rewrite_is_named(tiny_model_dir, finding):
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = ONE_REWRITE[finding] + CHATML_END
    report = check_template(tokenizer)
    assert report.findings == [finding] and not report.append_only
    assert report.modes["keep"].works and report.modes["keep"].rows == 1


def test_ids_that_stop_extending_a_row_are_a_finding():
    from transformers import AutoTokenizer

    from omrl.models import TINY_TOKENIZER_DIR

    tokenizer = AutoTokenizer.from_pretrained(TINY_TOKENIZER_DIR)  # "\n\n" alone: one token; "\n\nopen": three
    tokenizer.chat_template = (
        "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n\\n' + m.content + "
        "'<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n\\n' -}}{%- endif -%}"
    )
    report = check_template(tokenizer)
    assert report.findings == [IDS_CHANGED] and report.modes["as_template"].rows == TURNS


def test_tiny_chatml_is_append_only(tiny_model_dir):
    report = check_template(load_tokenizer(tiny_model_dir))
    assert report.append_only and report.findings == [] and report.trainable
    keep, as_template = report.modes["keep"], report.modes["as_template"]
    assert keep.works and as_template.works and keep.rows == as_template.rows == 1
    assert (keep.tokens, keep.trained, keep.prefill) == (as_template.tokens, as_template.trained, as_template.prefill)
    assert 0 < keep.trained < keep.tokens < keep.prefill


def test_dropped_reasoning_is_found_and_splits_as_template(model_dirs):
    report = check_template(load_tokenizer(model_dirs["drops_reasoning"]))
    assert not report.append_only and report.trainable
    assert REASONING_DROPPED in report.findings and EMPTY_BLOCK in report.findings
    keep, as_template = report.modes["keep"], report.modes["as_template"]
    assert keep.works and keep.rows == 1
    assert as_template.works and as_template.rows == TURNS  # every reply's reasoning is dropped by the next prompt
    assert keep.trained == as_template.trained and as_template.tokens > keep.tokens


def test_a_template_that_replaces_earlier_replies_is_not_said_to_drop_reasoning(tiny_model_dir):
    """It writes a placeholder for every reply but the last: the whole reply goes, and keep, which finds each
    reply's text in the render, cannot work; check-template called it dropped reasoning."""
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = (
        "{%- for m in messages -%}{%- if m.role == 'assistant' and not loop.last -%}"
        "{{- '<|im_start|>assistant\\n(earlier reply)<|im_end|>\\n' -}}{%- else -%}"
        "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}{%- endif -%}{%- endfor -%}"
    ) + CHATML_END
    report = check_template(tokenizer)
    assert report.findings == [REPLY_DROPPED]
    assert not report.modes["keep"].works and "drops an assistant reply's text" in report.modes["keep"].problem
    assert report.modes["as_template"].works


def test_answer_only_history_is_found(model_dirs):
    report = check_template(load_tokenizer(model_dirs["keeps_answer"]))
    assert not report.append_only
    assert any(finding.startswith("reasoning dropped") for finding in report.findings), report.findings
    assert report.modes["keep"].rows == 1 and report.modes["as_template"].rows > 1


def test_tool_role_template_appends_and_writes_tool_calls(model_dirs):
    report = check_template(load_tokenizer(model_dirs["tool_role"]))
    assert report.tool_role and report.tool_calls and TOOL_CALLS not in report.findings
    assert report.append_only and report.modes["keep"].works and report.modes["keep"].rows == 1


def test_reply_closed_by_text_leaves_only_as_template(model_dirs, capsys):
    report = check_template(load_tokenizer(model_dirs["ends_in_text"]))
    keep = report.modes["keep"]
    assert not keep.works and "special token" in keep.problem and "check-template" not in keep.problem
    assert report.modes["as_template"].works and report.trainable
    code, out, _ = cli(capsys, model_dirs["ends_in_text"])
    assert code == 0 and "use: chat.history=as_template" in out and "keep does not work" in out


@pytest.fixture(scope="module")
def tiny_checked(tiny_model_dir) -> tuple[int, str, str]:
    """``omrl check-template tiny`` run once for the tests that read it: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        main(["check-template", "tiny"])
    return exit_info.value.code, out.getvalue(), err.getvalue()


def test_cli_reports_an_append_only_template(tiny_checked):
    code, out, err = tiny_checked
    assert code == 0, err
    assert "append-only: yes" in out and "both modes give the same rows" in out
    assert any(line.split("│")[1:3] == [" keep        ", " yes   "] for line in out.splitlines()), out


def test_cli_names_the_rewrites_on_one_line_per_path(model_dirs, capsys):
    path = model_dirs["drops_reasoning"]
    code, out, err = cli(capsys, path)
    assert code == 0, err
    assert any(path in line for line in out.splitlines()), out  # the long path is never wrapped
    assert "append-only: no" in out and f"- {REASONING_DROPPED}" in out
    assert "chat.history=as_template shows the model exactly what deployment shows" in out


def test_cli_fails_on_a_template_no_mode_can_train(model_dirs, capsys):
    path = model_dirs["raises_after_reply"]
    code, out, err = cli(capsys, path)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: omrl cannot train the chat template of {path}"), err
    assert "keep: " in err and "as_template: " in err and "a reply must be the last message" in err
    assert "keep does not work" in out and "Traceback" not in err


def test_cli_fails_naming_a_case_a_mode_would_lay_out_wrongly(model_dirs, capsys):
    path = model_dirs["numbered"]
    code, out, err = cli(capsys, path)
    assert code == 2 and "Traceback" not in err
    assert f"omrl would lay out {path}'s reasoning episodes wrongly under chat.history=keep" in err
    assert "(message 4)" in err and "(message 6)" in err  # what keep appends, and what the template writes
    assert "keep reasoning: broken" in out
    keep = next(line for line in out.splitlines() if line.startswith("│ keep "))  # the history modes table's row
    assert "no: see the cases below" in keep  # it once said keep works, above the case that says it does not
    code, _, err = cli_exit(capsys, "rollout", "--model", path, "--env", "gridworld", "--expert", "--num-tasks", "1",
                            "-o", str(Path(path) / "expert.parquet"))  # fmt: skip
    assert code == 2 and "omrl would lay out this chat template's episodes wrongly" in err  # nor SFT data for it


def test_a_reply_the_template_writes_otherwise_is_quoted_from_the_line_they_part_on(model_dirs, capsys):
    """The quote began 20 characters before the prompt's end, mid-token: 'rt|>assistant\\nopen drawer 1...'."""
    code, out, err = cli(capsys, model_dirs["named_prompt"])
    said = " ".join(err.split())
    assert code == 2 and "where the template writes '<|im_start|>assistant\\nopen drawer" in said, said


def test_cli_shows_every_case_of_a_template_it_passes(tiny_checked):
    code, out, err = tiny_checked
    assert code == 0, err
    assert "episodes played the rollout's way" in out
    for case in ("plain", "specials", "noncanonical"):
        assert case in out
    assert "broken" not in out


def test_cli_passes_kwargs_to_the_template(model_dirs, capsys):
    path = model_dirs["needs_kwarg"]
    code, _, err = cli(capsys, path)
    assert code == 2 and "cannot render a first user message: TemplateError: pass ready" in err
    assert "give it with --kwargs" in err
    code, out, err = cli(capsys, path, "--kwargs", '{"ready": true}')
    assert code == 0, err
    assert '{"ready": true}' in out and "append-only: yes" in out
    code, _, err = cli(capsys, path, "--kwargs", "[1]")
    assert code == 2 and "--kwargs must be a JSON object, not list" in err


def test_a_run_missing_an_option_the_template_asks_for_is_told_to_set_it(model_dirs):
    """A run without it was told its episodes would be laid out wrongly under chat.history=keep."""
    from omrl.chat.conformance import check_run_template

    tokenizer = load_tokenizer(model_dirs["needs_kwarg"])
    with pytest.raises(
        OmrlError,
        match=r"cannot render a first user message \(TemplateError: pass ready\).*"
        r"chat.template_kwargs.NAME=VALUE \(options given: none\)",
    ):
        check_run_template(tokenizer, "keep")
    check_run_template(tokenizer, "keep", {"ready": True})


# templates that are hostile code: each would hang or exhaust memory in the process that renders it
HOSTILE = {
    "loops": ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "within 1 s"),
    "builds": ("{{ 'x' * 10**10 }}", "more than the 1 GiB of memory it is given"),
    "writes": (
        "{% for i in range(2000) %}{{ 'x' * 1000 }}{% endfor %}",  # fast to render, past the size bound
        "renders a short probe chat to 2,000,000 characters, more than 1,000,000",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_cli_refuses_a_template_that_renders_past_its_bounds(tiny_model_dir, tmp_path, capsys, monkeypatch, name):
    from omrl.chat import template_check

    source, message = HOSTILE[name]
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = source
    tokenizer.save_pretrained(tmp_path / name)
    shutil.copy(Path(tiny_model_dir) / "config.json", tmp_path / name)  # a model directory, its template replaced
    # only the looping template is meant to meet the time bound: the others are given time to spare on a busy machine
    monkeypatch.setattr(template_check, "RENDER_SECONDS", 1.0 if name == "loops" else 60.0, raising=False)
    code, out, err = cli(capsys, str(tmp_path / name))
    err = " ".join(err.split())
    assert code == 2 and message in err and "bug in omrl" not in err, err


def hostile_model_dir(tiny_model_dir, folder: Path, source: str) -> str:
    """A copy of the tiny model's directory whose chat template is ``source``."""
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = source
    tokenizer.save_pretrained(folder)
    shutil.copy(Path(tiny_model_dir) / "config.json", folder)
    shutil.copy(Path(tiny_model_dir) / "model.safetensors", folder)
    return str(folder)


@pytest.mark.parametrize("name,message", [("loops", "within 1 s"), ("writes", "characters, more than 1,000,000")])
def test_a_run_refuses_a_template_past_its_bounds_before_rendering_through_it(
    tiny_model_dir, tmp_path, capsys, monkeypatch, name, message
):
    from omrl.chat import template_check

    tiny_template = load_tokenizer(tiny_model_dir).chat_template
    source = HOSTILE[name][0] + tiny_template  # else a sound template: "writes" would lay out token-exactly
    folder = hostile_model_dir(tiny_model_dir, tmp_path / name, source)
    monkeypatch.setattr(template_check, "RENDER_SECONDS", 1.0 if name == "loops" else 60.0)  # as above
    out = tmp_path / "episodes.parquet"
    code, _, err = cli_exit(
        capsys, "rollout", "--env", "gridworld", "--model", folder, "-o", str(out), "--num-tasks", "1"
    )
    err = " ".join(err.split())
    assert code == 2 and message in err and "bug in omrl" not in err, err
    assert not out.exists()
    # a sound template is checked once: remembered in the process and under $OMRL_HOME for the next one
    calls = []
    monkeypatch.setattr(template_check, "check_render_bounds", lambda *args: calls.append(args))
    monkeypatch.setenv("OMRL_HOME", str(tmp_path / "home"))
    tokenizer = load_tokenizer(tiny_model_dir)
    tokenizer.chat_template = tiny_template + f"{{# {tmp_path} #}}"  # a template no test has checked
    for _ in range(2):
        template_check.check_render_bounds_once(tokenizer)
    monkeypatch.setattr(template_check, "_WITHIN_BOUNDS", set())  # as a new process starts
    template_check.check_render_bounds_once(tokenizer)
    assert len(calls) == 1 and len(list((tmp_path / "home" / "checked-templates").iterdir())) == 1
    template_check.check_render_bounds_once(tokenizer, {"other": "options"})
    assert len(calls) == 2


def test_a_template_that_drops_tool_messages_has_no_tool_role():
    from .families import family_tokenizer

    phi3 = family_tokenizer("phi3")  # writes nothing for a tool message (its render differs only in what follows)
    chat = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}, {"role": "tool", "content": "R!"}]
    assert "R!" not in phi3.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert check_template(phi3).tool_role is False
    assert check_template(family_tokenizer("qwen2_5")).tool_role is True


def test_gpt_oss_keep_carries_tool_results_after_a_call_ended_as_its_template_ends_one():
    from .families import family_tokenizer

    report = check_template(family_tokenizer("gptoss"))  # eos <|return|> ends an answer; <|call|> ends a call
    keep = report.modes["keep"]
    assert report.tool_role and keep.works and keep.tool_problem == ""


def test_cli_refuses_an_option_the_template_does_not_read(tiny_model_dir, capsys):
    code, out, err = cli(capsys, tiny_model_dir, "--kwargs", '{"enable_thinking": false}')
    assert code == 2 and out == "" and "Traceback" not in err
    assert "names enable_thinking, which the chat template does not read; the options it reads: none" in err


@pytest.mark.parametrize(
    "name, problem",
    [
        ("no_generation_prompt", "the template writes no generation prompt: the model would have to sample "),
        ("first_user_only", "the template drops a user message's text ('Drawer 1 is empty.')"),
    ],
)
def test_cli_fails_on_a_template_that_hides_a_turn_from_the_model(model_dirs, capsys, name, problem):
    code, out, err = cli(capsys, model_dirs[name])
    assert code == 2 and "Traceback" not in err
    assert "wrongly under chat.history=keep" in err and problem in " ".join(err.split())


def test_a_template_whose_user_turn_opens_the_answer_needs_no_generation_prompt(model_dirs, capsys):
    code, out, err = cli(capsys, model_dirs["inst"])
    assert code == 0, err
    assert "broken" not in out


def test_a_tool_call_template_asking_for_another_format_than_the_models_own_is_warned_of():
    """On gpt-oss, tool_call asked for Hermes text calls, and its expert wrote SFT data of them, in silence."""
    import warnings

    from omrl import registry
    from omrl.chat.history import warn_foreign_call_format
    from tests.chat.families import family_tokenizer

    hermes = registry.templates.get("tool_call")()
    with pytest.warns(UserWarning, match="asks for tool calls written as hermes, but the model's chat template writes "
                                          "them as harmony"):  # fmt: skip
        warn_foreign_call_format(hermes, family_tokenizer("gptoss"), {})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_foreign_call_format(hermes, family_tokenizer("qwen3"), {})  # Qwen3 writes Hermes calls itself
        warn_foreign_call_format(registry.templates.get("react")(), family_tokenizer("gptoss"), {})  # no calls


# ChatML whose assistant replies are upper-cased: it rewrites them, in every mode
UPPER = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + (m['content'] | upper if m['role'] == "
    "'assistant' else m['content']) + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_a_template_that_rewrites_a_reply_is_said_to_rewrite_it_not_to_drop_it():
    """An upper-casing template was said to drop the reply's text, and as_template was advised outright."""
    from omrl.chat.history import anchored_increment
    from omrl.errors import OmrlError
    from tests.chat.families import metaspace_tokenizer

    chat = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "open drawer 1"}]
    with pytest.raises(OmrlError, match="the chat template rewrites an assistant reply's text when a message follows"):
        anchored_increment(metaspace_tokenizer(UPPER), chat, [{"role": "user", "content": "ok"}], "<|im_end|>")


def test_check_template_says_no_mode_works_for_user_turns_where_their_cases_are_broken(tmp_path, capsys):
    """It said "keep works for user turns, not tool results" above the broken cases of those very turns."""
    from omrl.models import resolve_model_path
    from tests.chat.families import metaspace_tokenizer
    from tests.helpers import cli_exit

    metaspace_tokenizer(UPPER).save_pretrained(tmp_path)
    shutil.copy(Path(resolve_model_path("tiny")) / "config.json", tmp_path)
    code, out, err = cli_exit(capsys, "check-template", str(tmp_path))
    assert code == 2 and "keep plain: broken: reply 1 parsed back with content" in out + err
    assert "works for user turns" not in out + err
