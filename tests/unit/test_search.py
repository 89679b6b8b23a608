"""The search index ranks the obviously right tool first, never shows a disallowed one, and forgets exactly."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.bus.search import MAX_LIMIT, SearchIndex, tokenize

# key → (name, description, parameter names): shaped like the servers people actually connect.
CORPUS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "read_file": (
        "read_file",
        "Read the complete contents of a file from the file system. Handles various text encodings.",
        ("path",),
    ),
    "write_file": (
        "write_file",
        "Create a new file or completely overwrite an existing file with new content.",
        ("path", "content"),
    ),
    "list_directory": (
        "list_directory",
        "Get a detailed listing of all files and directories in a specified path.",
        ("path",),
    ),
    "git_status": ("git_status", "Shows the working tree status of a git repository.", ("repo_path",)),
    "git_commit": (
        "git_commit",
        "Records changes to the repository with a commit message.",
        ("repo_path", "message"),
    ),
    "git_log": ("git_log", "Shows the commit logs of a repository.", ("repo_path", "max_count")),
    "get_current_time": (
        "get_current_time",
        "Get the current time in a specific timezone. Use IANA names such as Asia/Tokyo or Europe/London.",
        ("timezone",),
    ),
    "convert_time": (
        "convert_time",
        "Convert a time between timezones.",
        ("source_timezone", "time", "target_timezone"),
    ),
    "calculate": (
        "calculate",
        "Evaluate an arithmetic expression and return the numeric result.",
        ("expression",),
    ),
    "fetch": (
        "fetch",
        "Fetches a URL from the internet and extracts the web page contents as markdown.",
        ("url", "max_length", "raw"),
    ),
    "send_email": (
        "sendEmail",
        "Send an email message to one or more recipients.",
        ("to", "subject", "body", "cc"),
    ),
    "search_emails": (
        "search_emails",
        "Search the mailbox for email messages matching a query.",
        ("query", "max_results"),
    ),
    "mcp__github__create_issue": (
        "mcp__github__create_issue",
        "Create a new issue in a GitHub repository.",
        ("owner", "repo", "title", "body", "labels"),
    ),
}

EXTRA = ("file_search", "Search for files and file contents in a directory tree by pattern.", ("path", "pattern"))

QUERIES = ["read a file", "file", "current time in Tokyo", "send email", "git commit message", "files in repository"]


def build(corpus: dict[str, tuple[str, str, tuple[str, ...]]] = CORPUS, **options: float) -> SearchIndex:
    index = SearchIndex(**options)
    for key, (name, description, parameters) in corpus.items():
        index.add(key, name=name, description=description, parameters=parameters)
    return index


def top(index: SearchIndex, query: str) -> str:
    return index.search(query)[0][0]


# -- tokenizer ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "terms"),
    [
        ("getCurrentTime", ["get", "current", "time"]),
        ("HTTPServerError", ["http", "server", "error"]),
        ("getV2Data", ["get", "v2", "data"]),
        ("read_file", ["read", "file"]),
        ("mcp__github__create_issue", ["mcp", "github", "create", "issue"]),
        ("fs.read-file", ["fs", "read", "file"]),
        ("Read the FILE, please!", ["read", "file", "please"]),
        ("files", ["file"]),
        ("directories", ["directory"]),
        ("addresses searches boxes", ["address", "search", "box"]),
        ("status access analysis bus", ["status", "access", "analysis", "bus"]),
        ("utf8 sha256 2024 x 9", ["utf8", "sha256", "2024"]),
        ("the of a to this that", []),
        ("", []),
    ],
)
def test_tokenize_splits_cases_and_folds_plurals(text: str, terms: list[str]) -> None:
    assert tokenize(text) == terms


def test_tokenize_treats_documents_and_queries_alike() -> None:
    assert tokenize("list_files") == tokenize("list file") == tokenize("ListFiles")


# -- ranking --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("read a file", "read_file"),
        ("current time in Tokyo", "get_current_time"),
        ("send email", "send_email"),
        ("send an e-mail to someone", "send_email"),
        ("search my mailbox", "search_emails"),
        ("what time is it in London", "get_current_time"),
        ("convert time between timezones", "convert_time"),
        ("commit changes", "git_commit"),
        ("working tree status", "git_status"),
        ("list files in a directory", "list_directory"),
        ("overwrite a file", "write_file"),
        ("evaluate arithmetic expression", "calculate"),
        ("download a web page", "fetch"),
        ("open a github issue", "mcp__github__create_issue"),
        ("mcp__github__create_issue", "mcp__github__create_issue"),
        ("SENDEMAIL", "send_email"),
        ("please read the whole file contents from disk right now", "read_file"),
    ],
)
def test_queries_rank_the_right_tool_first(query: str, expected: str) -> None:
    assert top(build(), query) == expected


def test_results_are_best_first_with_positive_scores() -> None:
    results = build().search("file contents", limit=MAX_LIMIT)
    scores = [score for _, score in results]
    assert len(results) > 2
    assert scores == sorted(scores, reverse=True)
    assert all(score > 0 for score in scores)


def test_a_full_name_match_outranks_a_description_stuffed_with_the_query() -> None:
    corpus = dict(CORPUS)
    corpus["history"] = ("history", "git log git log git log: the git log, git log and git log again", ("log",))
    index = build(corpus)
    results = index.search("git log")
    assert [key for key, _ in results[:2]] == ["git_log", "history"]


def test_the_name_field_weighs_more_than_the_description() -> None:
    index = build({"a_tool": ("a_tool", "backup", ()), "backup": ("backup", "a tool", ())})
    assert top(index, "backup now") == "backup"


def test_ties_break_by_key() -> None:
    same = ("copy", "Copy a thing somewhere.", ("source",))
    index = build({"zeta": same, "alpha": same, "mid": same})
    results = index.search("copy somewhere")
    assert [key for key, _ in results] == ["alpha", "mid", "zeta"]
    assert len({score for _, score in results}) == 1


def test_k1_and_b_change_scores_but_are_validated() -> None:
    assert build(k1=2.0, b=0.5).search("file") != build().search("file")
    assert top(build(k1=0.0, b=0.0), "read a file") == "read_file"
    for options in ({"k1": -0.1}, {"k1": float("nan")}, {"b": 1.5}, {"b": -0.1}):
        with pytest.raises(ValueError, match="must be"):
            SearchIndex(**options)


# -- allowed --------------------------------------------------------------------------------------


def test_a_disallowed_top_tool_never_appears_and_the_next_takes_its_place() -> None:
    index = build()
    everything = index.search("read a file", limit=MAX_LIMIT)
    assert everything[0][0] == "read_file"
    filtered = index.search("read a file", limit=MAX_LIMIT, allowed=lambda key: key != "read_file")
    assert filtered == everything[1:]
    assert index.search("read a file", limit=1, allowed=lambda key: key != "read_file") == [everything[1]]


def test_allowed_is_asked_only_about_keys_that_match_a_query_term() -> None:
    asked: list[str] = []

    def allowed(key: str) -> bool:
        asked.append(key)
        return False

    assert build().search("email", allowed=allowed) == []
    assert sorted(asked) == ["search_emails", "send_email"]


def test_nothing_allowed_gives_no_results() -> None:
    assert build().search("file", allowed=lambda key: False) == []


# -- add, remove, replace -------------------------------------------------------------------------


def test_adding_then_removing_a_tool_leaves_scores_exactly_as_before() -> None:
    before = build()
    churned = SearchIndex()
    for position, (key, (name, description, parameters)) in enumerate(CORPUS.items()):
        churned.add(key, name=name, description=description, parameters=parameters)
        if position == 4:
            churned.add("file_search", name=EXTRA[0], description=EXTRA[1], parameters=EXTRA[2])
    assert churned.search("file") != before.search("file")  # the extra tool moved document frequencies
    churned.remove("file_search")
    assert len(churned) == len(before)
    assert "file_search" not in churned
    for query in QUERIES:
        assert churned.search(query, limit=MAX_LIMIT) == before.search(query, limit=MAX_LIMIT)


def test_removing_a_tool_drops_it_and_matches_an_index_built_without_it() -> None:
    index = build()
    index.remove("read_file")
    without = build({key: doc for key, doc in CORPUS.items() if key != "read_file"})
    assert "read_file" not in index
    assert len(index) == len(CORPUS) - 1
    for query in QUERIES:
        assert index.search(query, limit=MAX_LIMIT) == without.search(query, limit=MAX_LIMIT)
    assert all(key != "read_file" for key, _ in index.search("read a file", limit=MAX_LIMIT))


def test_removing_an_absent_key_is_a_no_op() -> None:
    index = build()
    index.remove("no_such_tool")
    index.remove("read_file")
    index.remove("read_file")
    assert len(index) == len(CORPUS) - 1


def test_adding_an_existing_key_replaces_it() -> None:
    replacement = ("get_forecast", "Return the weather forecast for a city.", ("city",))
    index = build()
    index.add("read_file", name=replacement[0], description=replacement[1], parameters=replacement[2])
    fresh = build({**CORPUS, "read_file": replacement})
    assert len(index) == len(CORPUS)
    for query in [*QUERIES, "weather forecast"]:
        assert index.search(query, limit=MAX_LIMIT) == fresh.search(query, limit=MAX_LIMIT)
    assert top(index, "weather forecast") == "read_file"
    assert all(key != "read_file" for key, _ in index.search("file contents encodings", limit=MAX_LIMIT))


def test_parameters_given_as_one_string_are_refused() -> None:
    with pytest.raises(TypeError, match="iterable of parameter names"):
        SearchIndex().add("read_file", name="read_file", description="Read a file.", parameters="path")


def test_contains_answers_for_any_object() -> None:
    index = build()
    assert "fetch" in index
    assert "nope" not in index
    assert 42 not in index
    assert ["fetch"] not in index


# -- limits and empty answers ---------------------------------------------------------------------


def test_limit_is_honoured() -> None:
    index = build()
    assert len(index.search("file", limit=MAX_LIMIT)) > 2
    assert len(index.search("file", limit=2)) == 2
    assert index.search("file", limit=1) == index.search("file", limit=MAX_LIMIT)[:1]


@pytest.mark.parametrize("limit", [0, -1, MAX_LIMIT + 1])
def test_limit_outside_1_to_100_is_refused(limit: int) -> None:
    with pytest.raises(ValueError, match="limit"):
        build().search("file", limit=limit)
    with pytest.raises(ValueError, match="limit"):
        build().search("", limit=limit)


@pytest.mark.parametrize("query", ["", "   ", "!!! ---", "the of a", "is it to be", "x y z"])
def test_empty_or_stop_word_queries_find_nothing(query: str) -> None:
    assert build().search(query) == []


def test_unknown_words_find_nothing() -> None:
    assert build().search("xyzzy plugh frobnicate") == []


def test_an_empty_index_finds_nothing() -> None:
    assert SearchIndex().search("read a file") == []


def test_a_tool_with_no_terms_is_counted_but_never_found() -> None:
    index = build({"x": ("x", "", ()), **CORPUS})
    assert "x" in index
    assert all(key != "x" for key, _ in index.search("file", limit=MAX_LIMIT))


# -- properties -----------------------------------------------------------------------------------


def _odd(key: str) -> bool:
    return len(key) % 2 == 1


@given(query=st.text(), limit=st.integers(1, MAX_LIMIT))
def test_any_query_returns_only_allowed_present_keys_best_first(query: str, limit: int) -> None:
    index = build()
    results = index.search(query, limit=limit, allowed=_odd)
    assert len(results) <= limit
    assert all(_odd(key) and key in index for key, _ in results)
    scores = [score for _, score in results]
    assert scores == sorted(scores, reverse=True)


@given(
    name=st.text(max_size=40),
    description=st.text(max_size=200),
    parameters=st.lists(st.text(max_size=20), max_size=6),
    query=st.text(max_size=40),
)
def test_any_tool_added_then_removed_leaves_no_trace(
    name: str, description: str, parameters: list[str], query: str
) -> None:
    before = build()
    churned = build()
    churned.add("zz_extra", name=name, description=description, parameters=parameters)
    churned.remove("zz_extra")
    for text in (query, name, "read a file"):
        assert churned.search(text, limit=MAX_LIMIT) == before.search(text, limit=MAX_LIMIT)
