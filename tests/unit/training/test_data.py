"""Data loading, tokenization, packing and the errors for unusable data."""

from __future__ import annotations

import csv
import json

import pytest

from ctxext.errors import InputError
from ctxext.recipe.sections import DataSection
from ctxext.training.data.corpus import load_documents, prepare_data


def _doc(i: int, words: int) -> str:
    return " ".join(f"def f{i}_{k}(x): return x + {k}" for k in range(words))


@pytest.fixture()
def jsonl(tmp_path):
    path = tmp_path / "docs.jsonl"
    with path.open("w") as f:
        for i in range(8):
            f.write(json.dumps({"body": _doc(i, 30 + 10 * i), "id": i}) + "\n")
    return path


def test_jsonl_packing_blocks_eos_and_heldout_split(jsonl, tiny_tokenizer):
    data = prepare_data(DataSection(path=str(jsonl), text_field="body", validation_fraction=0.25), tiny_tokenizer, 64)
    assert data.documents == 8
    assert len(data.train) > 0 and data.validation is not None and len(data.validation) > 0
    ids = data.train[:]["input_ids"]
    assert ids.shape[1] == 64
    # EOS separates the documents inside the packed stream: as many EOS as documents fit in it.
    eos = tiny_tokenizer.eos_token_id
    assert int((ids == eos).sum()) >= 1
    # The held-out documents never appear in training blocks: compare the (unique) function names.
    train_text = "".join(tiny_tokenizer.decode(row) for row in ids)
    val_text = "".join(tiny_tokenizer.decode(row) for row in data.validation[:]["input_ids"])
    val_names = {w.split("(")[0] for w in val_text.split() if w.startswith("f") and "_" in w and "(" in w}
    train_names = {w.split("(")[0] for w in train_text.split() if w.startswith("f") and "_" in w and "(" in w}
    assert val_names and not (val_names & train_names)


def test_parquet_txt_folder_and_cache(tmp_path, tiny_tokenizer):
    import pandas as pd

    pq = tmp_path / "d.parquet"
    pd.DataFrame({"text": [_doc(i, 40) for i in range(6)]}).to_parquet(pq)
    data = prepare_data(DataSection(path=str(pq), validation_fraction=0), tiny_tokenizer, 64)
    assert data.validation is None and data.documents == 6
    # datasets caches the tokenized files: the map results live in cache files, not only in memory.
    assert data.train.cache_files

    folder = tmp_path / "txt"
    folder.mkdir()
    for i in range(4):
        (folder / f"{i}.txt").write_text(_doc(i, 40) + "\n\nsecond paragraph\nthird line\n")
    docs = load_documents(str(folder))
    assert len(docs) == 4  # one document per file, not one per line
    data = prepare_data(DataSection(path=str(folder), num_proc=2), tiny_tokenizer, 64)
    assert data.documents == 4


def test_builtin_stdlib_and_no_packing(tiny_tokenizer):
    section = DataSection(path="builtin:stdlib", max_documents=12, packing=False, min_tokens=300)
    data = prepare_data(section, tiny_tokenizer, 300)
    assert data.train[:]["input_ids"].shape[1] == 300
    assert data.documents == 12


def test_empty_data_is_a_clear_error(tmp_path, tiny_tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"text": "   "}) + "\n")
    with pytest.raises(InputError, match="holds no documents with text"):
        prepare_data(DataSection(path=str(empty)), tiny_tokenizer, 64)
    folder = tmp_path / "nothing"
    folder.mkdir()
    with pytest.raises(InputError, match="empty folder"):
        prepare_data(DataSection(path=str(folder)), tiny_tokenizer, 64)


def test_missing_text_field_names_the_fields(jsonl, tiny_tokenizer):
    with pytest.raises(InputError, match=r"no field 'text' \(8 documents\); its fields are: body, id"):
        prepare_data(DataSection(path=str(jsonl)), tiny_tokenizer, 64)


def test_no_document_long_enough_says_how_long_they_are(jsonl, tiny_tokenizer):
    section = DataSection(path=str(jsonl), text_field="body", packing=False)
    with pytest.raises(InputError, match=r"at least 4096 tokens long \(8 documents, \d+ tokens in all; lengths min"):
        prepare_data(section, tiny_tokenizer, 4096)
    with pytest.raises(InputError, match=r"too short to make even one block of 100000 tokens"):
        prepare_data(DataSection(path=str(jsonl), text_field="body"), tiny_tokenizer, 100000)


def test_unsupported_files_and_unknown_names(tmp_path, tiny_tokenizer):
    (tmp_path / "a.csvx").write_text("x")
    with pytest.raises(InputError, match="holds files of type .csvx"):
        load_documents(str(tmp_path))
    with pytest.raises(InputError, match="does not exist"):
        load_documents("./no/such/folder")
    # A Hub name with HF_HUB_OFFLINE=1: says so, no traceback, no 23 s of retries.
    with pytest.raises(InputError, match="HF_HUB_OFFLINE"):
        load_documents("someone/some-long-documents")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".py", ".text", ".md"])
def test_training_and_evaluation_read_the_same_file_types(tmp_path, suffix):
    # One list of file types (ctxext.models.data_sources) for both readers: what one reads, the other reads too.
    from ctxext.models.data_sources import file_kind
    from ctxext.scoring.texts import iter_texts

    docs = ["def f(x):\n    return x + 1\n", "class A:\n    pass\n"]
    folder = tmp_path / "docs"
    folder.mkdir()
    if file_kind("d" + suffix) == "text":
        for i, doc in enumerate(docs):
            (folder / f"d{i}{suffix}").write_text(doc)
        source = str(folder)
    elif suffix == ".csv":
        source = str(folder / f"d{suffix}")
        with (folder / f"d{suffix}").open("w", newline="") as f:
            csv.writer(f).writerows([["text"], *([d] for d in docs)])
    else:
        source = str(folder / f"d{suffix}")
        (folder / f"d{suffix}").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    assert sorted(load_documents(source)["text"]) == sorted(docs)
    assert sorted(iter_texts(source)) == sorted(docs)


def test_a_missing_file_is_a_path_for_both_readers_and_a_bare_name_is_a_hub_id():
    from ctxext.models.data_sources import looks_like_path

    assert looks_like_path("nope.jsonl") and looks_like_path("./x") and looks_like_path("a/b/c")
    assert not looks_like_path("pg19") and not looks_like_path("org/name")
    from ctxext.scoring.texts import iter_texts

    with pytest.raises(InputError, match="does not exist"):
        load_documents("nope.jsonl")
    with pytest.raises(InputError, match="does not exist"):
        list(iter_texts("nope.jsonl"))
