"""Text out of a file's bytes: PDF (pypdf), Word .docx (python-docx), HTML (lxml's HTML parser)
and plain text. Run only in the extraction child (``files/worker.py``), under its limits; the
type comes from the bytes, the client's file name only tells HTML or Markdown from plain text.

Every refusal is a ``Refusal`` with a message written here: no library's error text (which may
quote the file) reaches the client.
"""

from __future__ import annotations

import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path

DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
_TEXT_TYPES = {"md": "text/markdown", "markdown": "text/markdown", "csv": "text/csv", "json": "application/json"}
_HTML_EXTS = ("html", "htm", "xhtml")
_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"  # legacy Office (.doc, .xls, .ppt)
_IMAGES = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"RIFF")
_MAX_ZIP_MEMBERS = 5000
SUPPORTED = "PDF, Word (.docx), HTML and plain text (.txt, .md, .csv, .json, source code)"


class Refusal(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Extracted:
    text: str
    file_type: str
    title: str
    truncated: bool


class TextBudget:
    """Collects text up to ``max_chars``; a reader stops once it is full."""

    def __init__(self, max_chars: int) -> None:
        self.left = max_chars
        self.parts: list[str] = []
        self.truncated = False

    def add(self, piece: str) -> bool:
        piece = piece.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate becomes "?"
        if self.parts and piece:
            piece = "\n\n" + piece
        if len(piece) > self.left:
            piece, self.truncated = piece[: self.left], True
        self.parts.append(piece)
        self.left -= len(piece)
        return not self.truncated

    def text(self) -> str:
        return "".join(self.parts)


def extract(path: Path, ext: str, max_chars: int, max_pages: int, max_unpacked: int) -> Extracted:
    with path.open("rb") as f:
        head = f.read(1024)
    if b"%PDF-" in head:
        return read_pdf(path, max_chars, max_pages)
    if head.startswith(b"PK\x03\x04"):
        return read_docx(path, max_chars, max_unpacked)
    if head.startswith(_OLE):
        raise Refusal(
            "unsupported_file_type",
            f"Legacy Office files (.doc, .xls, .ppt) are not read; save it as .docx or PDF. Supported: {SUPPORTED}.",
        )
    if head.startswith(_IMAGES) or head[4:8] == b"ftyp":
        raise Refusal(
            "unsupported_file_type", "This is an image or a video: upload it with purpose 'image' or 'video'."
        )
    if ext == "pdf":
        raise Refusal("file_unreadable", "The file is named .pdf but is not a PDF.")
    if ext == "docx":
        raise Refusal("file_unreadable", "The file is named .docx but is not a Word document.")
    data = path.read_bytes()
    text = decode_text(data)
    if ext in _HTML_EXTS or _looks_like_html(text):
        return read_html(text, max_chars)
    budget = TextBudget(max_chars)
    budget.add(text)
    return Extracted(budget.text(), _TEXT_TYPES.get(ext, "text/plain"), "", budget.truncated)


def read_pdf(path: Path, max_chars: int, max_pages: int) -> Extracted:
    from pypdf.errors import LimitReachedError

    try:
        return _read_pdf(path, max_chars, max_pages)
    except LimitReachedError:  # pypdf's own bound on what one stream may unpack to
        raise Refusal(
            "file_too_complex", "The PDF holds a stream that unpacks to more than this server reads."
        ) from None


def _read_pdf(path: Path, max_chars: int, max_pages: int) -> Extracted:
    from pypdf import PdfReader

    reader = PdfReader(path)
    if reader.is_encrypted and not _opened_without_password(reader):
        raise Refusal("encrypted_file", "The PDF is protected by a password; upload it unlocked.")
    count = len(reader.pages)
    if count > max_pages:
        raise Refusal(
            "too_many_pages",
            f"The PDF has {count} pages; this server extracts text from at most {max_pages} (files_max_pages).",
        )
    title = ""
    if reader.metadata is not None and reader.metadata.title:
        title = str(reader.metadata.title)
    budget = TextBudget(max_chars)
    for page in reader.pages:
        if not budget.add((page.extract_text() or "").strip()):
            break
    text = budget.text()
    if not text.strip():
        raise Refusal(
            "file_unreadable",
            "The PDF holds no text this server can read: a scanned document needs OCR, which this server does not do.",
        )
    return Extracted(text, "application/pdf", title, budget.truncated)


def _opened_without_password(reader: object) -> bool:
    try:
        return bool(reader.decrypt(""))  # type: ignore[attr-defined]
    except Exception:
        return False


def read_docx(path: Path, max_chars: int, max_unpacked: int) -> Extracted:
    _check_package(path, max_unpacked)
    from docx import Document
    from docx.table import Table

    doc = Document(str(path))
    budget = TextBudget(max_chars)
    for block in doc.iter_inner_content():
        if isinstance(block, Table):
            text = "\n".join(" | ".join(cell.text for cell in row.cells) for row in block.rows)
        else:
            text = block.text
        if text.strip() and not budget.add(text):
            break
    return Extracted(budget.text(), DOCX, doc.core_properties.title or "", budget.truncated)


def _check_package(path: Path, max_unpacked: int) -> None:
    """The zip's own directory, read before anything is unpacked: a Word document, and one
    that unpacks to a size the server reads (a zip bomb is refused here, from its header)."""
    try:
        with zipfile.ZipFile(path) as package:
            members = package.infolist()
    except (zipfile.BadZipFile, OSError, ValueError):
        raise Refusal("file_unreadable", "The file is a damaged zip archive, not a readable Word document.") from None
    names = {m.filename for m in members}
    if "word/document.xml" not in names:
        what = (
            "an Excel workbook"
            if "xl/workbook.xml" in names
            else "a PowerPoint deck"
            if "ppt/presentation.xml" in names
            else "a zip archive"
        )
        raise Refusal("unsupported_file_type", f"The file is {what}, not a Word document. Supported: {SUPPORTED}.")
    unpacked = sum(m.file_size for m in members)
    if len(members) > _MAX_ZIP_MEMBERS or unpacked > max_unpacked:
        raise Refusal(
            "file_too_complex",
            f"The document unpacks to {unpacked} bytes in {len(members)} parts, more than this server "
            f"reads ({max_unpacked} bytes, {_MAX_ZIP_MEMBERS} parts).",
        )


def read_html(text: str, max_chars: int) -> Extracted:
    from lxml import html

    # Parsed from the text decoded above, handed over as UTF-8: lxml's own guess at an
    # undeclared encoding is Latin-1.
    parser = html.HTMLParser(encoding="utf-8", remove_comments=True)
    root = html.document_fromstring(text.encode("utf-8"), parser=parser)
    title = " ".join((root.findtext(".//title") or "").split())
    for hidden in root.xpath("//script|//style|//noscript|//template|//head|//svg"):
        hidden.drop_tree()  # keeps the text after it
    for block in root.iter(*_BLOCKS):
        block.tail = "\n" + (block.tail or "")
    budget = TextBudget(max_chars)
    budget.add(_tidy(root.text_content()))
    return Extracted(budget.text(), "text/html", title, budget.truncated)


_BLOCKS = (
    "p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article",
    "header", "footer", "blockquote", "pre", "table", "ul", "ol", "dt", "dd", "hr", "td", "th",
)  # fmt: skip


def _tidy(text: str) -> str:
    """One space between words, at most one blank line between blocks."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    out: list[str] = []
    for line in lines:
        if line or (out and out[-1]):
            out.append(line)
    return "\n".join(out).strip()


def decode_text(data: bytes) -> str:
    """The bytes as text (UTF-8, UTF-16 with a byte-order mark, or GB18030), or a Refusal for
    anything that is not text: a binary file decodes to control characters or not at all."""
    for bom, encoding in ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16")):
        if data.startswith(bom):
            return _text_or_refuse(data, encoding)
    try:
        return _text_or_refuse(data, "utf-8")
    except Refusal:
        return _text_or_refuse(data, "gb18030")


def _text_or_refuse(data: bytes, encoding: str) -> str:
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError:
        raise Refusal(
            "unsupported_file_type", f"The file is not text nor a supported document. Supported: {SUPPORTED}."
        ) from None
    sample = text[:65536]
    controls = sum(1 for ch in sample if unicodedata.category(ch) == "Cc" and ch not in "\t\n\r\f\v")
    if "\x00" in sample or controls > len(sample) // 100:
        raise Refusal(
            "unsupported_file_type", f"The file is binary, not text nor a supported document. Supported: {SUPPORTED}."
        )
    return text


def _looks_like_html(text: str) -> bool:
    start = text.lstrip()[:200].lower()
    return start.startswith("<!doctype html") or start.startswith("<html")
