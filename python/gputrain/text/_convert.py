"""Building a `tokenizers.Tokenizer` for folders without tokenizer.json, as transformers (5.x) does
when it loads them: vocab.txt (older BERT folders) becomes BertTokenizer's WordPiece pipeline, and
spm.model (DeBERTa-v3 folders) DebertaV2Tokenizer's Unigram pipeline, read through `sentencepiece`
(with `protobuf`, as transformers' SentencePieceExtractor reads it). The special tokens are added
afterwards by the caller (gputrain.text.tokenizer), as transformers adds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputrain.text._files import FolderSettings

# The special tokens a family's tokenizer class uses when the files name none (its __init__ defaults).
FAMILY_DEFAULTS: dict[str, dict[str, str]] = {
    "bert": {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"},
    "distilbert": {"unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]", "mask": "[MASK]"},
    "debertav2": {"bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]", "sep": "[SEP]", "pad": "[PAD]", "cls": "[CLS]",
                  "mask": "[MASK]"},
    "roberta": {"bos": "<s>", "eos": "</s>", "sep": "</s>", "cls": "<s>", "unk": "<unk>", "pad": "<pad>",
                "mask": "<mask>"},
}
FAMILY_DEFAULTS["xlmroberta"] = FAMILY_DEFAULTS["roberta"]
_WORDPIECE_FAMILIES = ("bert", "distilbert")
_SPM_FAMILIES = ("debertav2",)


def _option(settings: FolderSettings, key: str, default: Any) -> Any:
    value = settings.config.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{settings.folder / 'tokenizer_config.json'}: {key} must be true, false or null, "
                         f"got {value!r}")
    return value


def _check_family(settings: FolderSettings, path: Path, families: tuple[str, ...], what: str) -> None:
    family = settings.family
    if family is not None and family not in families:
        raise ValueError(f"{path}: only {what} folders are converted from {path.name} (tokenizer_config.json's "
                         f"tokenizer_class / config.json's model_type says {family!r}); give the folder a "
                         "tokenizer.json (transformers' tokenizer.save_pretrained writes one)")


def wordpiece_from_vocab(path: Path, settings: FolderSettings) -> Any:
    """BertTokenizer's pipeline over vocab.txt: one token a line (trailing whitespace dropped), its
    id the line number."""
    from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import WordPiece

    _check_family(settings, path, _WORDPIECE_FAMILIES, "BERT-family (WordPiece)")
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error}); expected one WordPiece token a line") from None
    if lines and lines[-1] == "":
        lines.pop()  # the newline ending the last line
    vocab = {token.rstrip(): index for index, token in enumerate(lines)}  # as tokenizers' WordPiece.read_file
    if not vocab:
        raise ValueError(f"{path}: the vocabulary is empty")
    unk = settings.special_tokens["unk"] or "[UNK]"
    tokenizer = Tokenizer(WordPiece(vocab, unk_token=unk))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=_option(settings, "tokenize_chinese_chars", True),
        strip_accents=_option(settings, "strip_accents", None),
        lowercase=settings.do_lower_case if settings.do_lower_case is not None else True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def _spm_proto(path: Path) -> Any:
    """spm.model's ModelProto, parsed with the protobuf classes that ship with `sentencepiece` (as
    transformers' SentencePieceExtractor parses it). SentencePieceProcessor is not called: its
    errors are C++ exceptions, which abort a process run under AddressSanitizer's LD_PRELOAD."""
    try:
        from sentencepiece import sentencepiece_model_pb2
    except ImportError as error:
        raise ImportError(f"{path}: converting a SentencePiece model needs the packages 'sentencepiece' and "
                          f"'protobuf' (pip install sentencepiece protobuf; {error}), or a tokenizer.json in "
                          "the folder (transformers' tokenizer.save_pretrained writes one)") from None
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(path.read_bytes())
    except Exception as error:  # protobuf's DecodeError
        raise ValueError(f"{path}: not a SentencePiece model ({type(error).__name__}: {error})") from None
    if not proto.pieces:
        raise ValueError(f"{path}: not a SentencePiece model (no pieces in it)")
    return proto


def unigram_from_spm(path: Path, settings: FolderSettings) -> tuple[Any, list[str]]:
    """DebertaV2Tokenizer's pipeline over spm.model, and the model's control pieces (transformers
    adds them as special tokens)."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import Unigram

    _check_family(settings, path, _SPM_FAMILIES, "DeBERTa-v2/v3 (SentencePiece)")
    proto = _spm_proto(path)
    if proto.trainer_spec.model_type != 1:  # 1: UNIGRAM
        raise ValueError(f"{path}: a SentencePiece model of type {proto.trainer_spec.model_type} (not Unigram); "
                         "DeBERTa-v3's spm.model is a Unigram model")
    vocab = [(piece.piece, piece.score) for piece in proto.pieces]
    unk = settings.special_tokens["unk"] or "[UNK]"
    unk_id = vocab.index((unk, 0.0)) if (unk, 0.0) in vocab else proto.trainer_spec.unk_id
    tokenizer = Tokenizer(Unigram(vocab, unk_id=unk_id, byte_fallback=False))
    steps = [normalizers.Lowercase()] if settings.do_lower_case else []
    charsmap = proto.normalizer_spec.precompiled_charsmap
    if charsmap:
        steps += [normalizers.Precompiled(charsmap), normalizers.Strip(left=False, right=True),
                  normalizers.Replace(Regex(r" {2,}"), " ")]
    else:
        steps += [normalizers.Replace(Regex(r"\s{2,}|[\n\r\t]"), " "), normalizers.NFC(),
                  normalizers.Strip(left=False, right=True)]
    tokenizer.normalizer = normalizers.Sequence(steps)
    scheme = "always" if _option(settings, "add_prefix_space", True) else "first"
    splits = [pre_tokenizers.Punctuation(behavior="isolated")] if _option(settings, "split_by_punct", False) else []
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(splits + [pre_tokenizers.Metaspace(replacement="▁",
                                                                                       prepend_scheme=scheme)])
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme)
    control = [piece.piece for piece in proto.pieces if piece.type == 3]  # CONTROL
    return tokenizer, control


def cls_sep_template(tokenizer: Any, cls: str | None, sep: str | None, path: Path) -> Any:
    """BERT's and DeBERTa's post-processor: [CLS] A [SEP] (B [SEP], type id 1)."""
    from tokenizers import processors

    ids = {name: tokenizer.token_to_id(token) if token else None for name, token in (("cls", cls), ("sep", sep))}
    missing = [name for name, token_id in ids.items() if token_id is None]
    if missing:
        raise ValueError(f"{path}: the vocabulary has no {' and no '.join(t + '_token' for t in missing)} "
                         f"({cls!r}, {sep!r}); a sentence-pair template needs both")
    return processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0", pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, ids["cls"]), (sep, ids["sep"])])


__all__ = ["FAMILY_DEFAULTS", "cls_sep_template", "unigram_from_spm", "wordpiece_from_vocab"]
