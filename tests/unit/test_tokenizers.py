"""Tokenizers (`--tokenizer bytes|bpe[:VOCAB]|PATH`): deterministic BPE, exact bytes per
token, the same validation bytes whatever the tokenizer, and the cache's keys."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from phalanx.config.sections import build_config
from phalanx.data import corpus
from phalanx.data.corpus import prepare
from phalanx.data.tokenizer import (
    ByteTokenizer,
    HFTokenizer,
    encode_raw,
    load_tokenizer_file,
    token_dtype,
    train_bpe,
)
from phalanx.data.writer import split_chunks
from phalanx.errors import UserError

TEXTS = ["def alpha(beta):\n    return beta * 2  # café, naïve, 東京, 🙂\n",
         "Größe: 3 µm — ÆØÅ. <|endoftext|> tabs\tand  spaces\r\n", ""]
QUIET = dict(log=lambda line: None)


@pytest.fixture(scope="module")
def bpe(corpus_file):
    return train_bpe([corpus_file.read_text()] * 2, 400)


def test_bpe_training_is_deterministic(corpus_file, bpe, tmp_path):
    again = train_bpe([corpus_file.read_text()] * 2, 400)
    assert again.tok.to_str() == bpe.tok.to_str()
    assert bpe.vocab_size == 400
    one = prepare(str(corpus_file), str(tmp_path / "a"), 0.1, tokenizer="bpe:300", **QUIET)
    two = prepare(str(corpus_file), str(tmp_path / "b"), 0.1, tokenizer="bpe:300", **QUIET)
    assert one.tokenizer_path.read_bytes() == two.tokenizer_path.read_bytes()
    assert np.array_equal(one.load("train"), two.load("train"))


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_are_exact(bpe, text):
    for tok in (ByteTokenizer(), bpe):
        ids = tok.encode(text)
        assert int(tok.token_bytes()[ids].sum()) == len(text.encode("utf-8"))
        assert tok.decode(ids) == text


def test_token_bytes_of_a_gpt2_style_file_count_its_added_token(tmp_path, bpe):
    bpe.tok.add_special_tokens(["<|endoftext|>"])
    path = tmp_path / "tokenizer.json"
    bpe.tok.save(str(path))
    tok = load_tokenizer_file(path)
    text = TEXTS[1]
    ids = tok.encode(text)
    assert tok.vocab_size == 401 and 400 in ids  # the special token, cut from the text
    assert int(tok.token_bytes()[ids].sum()) == len(text.encode())
    assert tok.decode_bytes(ids) == text.encode()


def test_token_bytes_are_none_when_they_cannot_be_known(tmp_path):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "words.json"
    tok.save(str(path))
    words = load_tokenizer_file(path)
    assert words.token_bytes() is None and words.encode("hello world") == [1, 2]
    prefixed = Tokenizer(models.BPE())
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)  # adds a byte
    prefixed.decoder = decoders.ByteLevel()
    assert HFTokenizer(prefixed, "x").token_bytes() is None


def test_characters_cut_by_the_split_keep_their_bytes(bpe):
    raw = "naïve 東京 🙂 end".encode()
    for a in range(len(raw)):
        for b in range(a + 1, len(raw) + 1, 3):
            ids = encode_raw(bpe, [raw[a:b]])[0]
            assert bpe.decode_bytes(ids) == raw[a:b]


def test_validation_bytes_are_the_same_for_every_tokenizer(tmp_path, corpus_file, bpe):
    text = corpus_file.read_text() + "\nunicode: é 東京 🙂 " * 200
    (tmp_path / "c.txt").write_text(text)
    bpe.tok.save(str(tmp_path / "mine.json"))
    split = {spec: prepare(str(tmp_path / "c.txt"), str(tmp_path / "cache"), 0.1,
                           tokenizer=spec, **QUIET)
             for spec in ("bytes", "bpe:300", str(tmp_path / "mine.json"))}
    val = bytes(split["bytes"].load("val"))
    for spec in ("bpe:300", str(tmp_path / "mine.json")):
        s = split[spec]
        assert s.dtype == "uint16" and s.val_bytes == len(val)
        assert s.tokenizer().decode_bytes(s.load("val")) == val
        assert int(s.token_bytes()[s.load("val")].sum()) == len(val)  # nats/byte's divisor
        assert s.n_val < len(val) / 1.5  # tokens are several bytes
    assert split["bpe:300"].tokenizer_label == "bpe 300 (trained on the training split)"
    assert split["bpe:300"].tokenizer_path.parent == split["bpe:300"].train.parent


def test_the_bpe_learns_from_the_training_split_only(tmp_path, corpus_file, monkeypatch):
    seen: list[str] = []

    def spy(texts, vocab_size):
        texts = list(texts)
        seen.extend(texts)
        return train_bpe(texts, vocab_size)

    monkeypatch.setattr(corpus, "train_bpe", spy)
    s = prepare(str(corpus_file), str(tmp_path), 0.1, tokenizer="bpe:300", **QUIET)
    plain = prepare(str(corpus_file), str(tmp_path), 0.1, **QUIET)
    assert "".join(seen).encode() == bytes(plain.load("train"))  # (ASCII: nothing cut)
    assert json.loads(s.tokenizer_path.read_text())["model"]["type"] == "BPE"


def test_bytes_split_is_unchanged(tmp_path, corpus_file, small_corpus_file):
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "a.txt").write_bytes(corpus_file.read_bytes())
    (folder / "b.txt").write_bytes(small_corpus_file.read_bytes())
    joined = np.frombuffer(corpus_file.read_bytes() + b"\n\n" + small_corpus_file.read_bytes(),
                           np.uint8)
    train, val = split_chunks(joined, 0.05)
    splits = prepare(str(folder), str(tmp_path / "cache"), 0.05, **QUIET)
    assert splits.dtype == "uint8" and splits.vocab_size == 256
    assert bytes(splits.load("train")) == train.tobytes()
    assert bytes(splits.load("val")) == val.tobytes()


def test_the_cache_is_reused_and_keyed_by_vocab(tmp_path, small_corpus_file):
    said: list[str] = []
    first = prepare(str(small_corpus_file), str(tmp_path), 0.1, said.append, tokenizer="bpe:300")
    mtime = first.train.stat().st_mtime_ns
    again = prepare(str(small_corpus_file), str(tmp_path), 0.1, said.append, tokenizer="bpe:300")
    assert again == first and again.train.stat().st_mtime_ns == mtime
    assert len(said) == 1 and "training a 300-id BPE" in said[0]  # trained once
    other = prepare(str(small_corpus_file), str(tmp_path), 0.1, tokenizer="bpe:320", **QUIET)
    plain = prepare(str(small_corpus_file), str(tmp_path), 0.1, **QUIET)
    folders = {s.train.parent for s in (first, other, plain)}
    assert len(folders) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in folders)


def test_a_cache_entry_is_bound_to_its_key_and_its_files(tmp_path, small_corpus_file):
    from textgen import make_text

    other = tmp_path / "other.txt"
    other.write_text(make_text(3000, seed=9).upper())
    cache = tmp_path / "cache"
    a = prepare(str(small_corpus_file), str(cache), 0.1, tokenizer="bpe:300", **QUIET)
    b = prepare(str(other), str(cache), 0.1, tokenizer="bpe:300", **QUIET)
    tok_a, train_a = a.tokenizer_path.read_bytes(), bytes(a.load("train"))
    assert tok_a != b.tokenizer_path.read_bytes()
    (a.train.parent / "tokenizer.json").write_bytes(b.tokenizer_path.read_bytes())  # swapped
    said: list[str] = []
    again = prepare(str(small_corpus_file), str(cache), 0.1, said.append, tokenizer="bpe:300")
    assert again.tokenizer_path.read_bytes() == tok_a, "another corpus's tokenizer was used"
    assert "does not match what it was built with" in said[0] and "rebuilding" in said[0]
    folder_a, folder_b = a.train.parent, b.train.parent  # two whole entries swapped
    folder_a.rename(tmp_path / "swap")
    folder_b.rename(folder_a)
    (tmp_path / "swap").rename(folder_b)
    again = prepare(str(small_corpus_file), str(cache), 0.1, said.append, tokenizer="bpe:300")
    assert bytes(again.load("train")) == train_a, "another corpus's tokens were used"
    st = os.stat(again.train)  # rewritten in place, same size, its mtime put back
    again.train.write_bytes(train_a[::-1])
    os.utime(again.train, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = prepare(str(small_corpus_file), str(cache), 0.1, said.append, tokenizer="bpe:300")
    assert bytes(again.load("train")) == train_a, "tokens rewritten in place were used"


@pytest.mark.parametrize("spec, needle", [
    ("bpe:abc", "whole number in 257..65536"), ("bpe:256", "257..65536"),
    ("bpe:70000", "257..65536")])
def test_bad_bpe_specs_are_refused_with_the_config(spec, needle):
    with pytest.raises(UserError, match=needle):
        build_config({"data": {"tokenizer": spec}})


@pytest.mark.parametrize("content, needle", [
    (None, "is not a file"), ("{nope", "is not a JSON file"),
    ('{"version": "1.0", "hello": 3}', "is JSON but not a tokenizer")])
def test_bad_tokenizer_files_are_one_line(tmp_path, content, needle):
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=needle) as info:
        prepare(None, str(tmp_path / "cache"), tokenizer=str(path))
    assert "\n" not in str(info.value) and not (tmp_path / "cache").exists()


def test_a_vocabulary_above_65536_is_stored_as_uint32(tmp_path):
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 70_000, "world": 5},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "big.json"))
    (tmp_path / "t.txt").write_text("hello world " * 400)
    s = prepare(str(tmp_path / "t.txt"), str(tmp_path / "c"), 0.1, tokenizer=str(
        tmp_path / "big.json"), **QUIET)
    assert (s.dtype, s.vocab_size, s.train.suffix) == ("uint32", 70_001, ".u32")
    assert 70_000 in set(s.load("train").tolist()) and s.token_bytes() is None
    assert [token_dtype(n) for n in (256, 257, 65536, 65537)] == [
        "uint8", "uint16", "uint16", "uint32"]


def test_auto_is_bpe_for_a_large_text_and_bytes_for_a_small_one(tmp_path):
    """`--tokenizer auto` (the default): a BPE needs text to learn its merges."""
    from phalanx.config.data_spec import AUTO_MIN_BYTES, auto_tokenizer, vocab_size_of

    small = tmp_path / "small.txt"
    small.write_text("x = 1\n" * 100)
    big = tmp_path / "big"
    big.mkdir()
    for i in range(3):
        (big / f"part{i}.txt").write_text("y" * (AUTO_MIN_BYTES // 2))
    (tmp_path / "bins").mkdir()
    (tmp_path / "bins" / "train.bin").write_bytes(b"\0" * (2 * AUTO_MIN_BYTES))
    assert auto_tokenizer(None) == "bpe:4096"  # the embedded corpus: 12 MB of Python
    assert auto_tokenizer(str(small)) == "bytes"
    assert auto_tokenizer(str(big)) == "bpe:4096"
    assert auto_tokenizer(str(tmp_path / "bins")) == "bytes"  # ids are the tokens
    assert vocab_size_of("auto", str(small)) == 256
    assert vocab_size_of("auto", None) == 4096
    from phalanx.data.corpus import prepare

    splits = prepare(str(small), str(tmp_path / "cache"), 0.1, tokenizer="auto")
    assert splits.tokenizer_kind == "bytes" and splits.vocab_size == 256
