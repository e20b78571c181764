"""Documents made by the tests, for the Files API: PDFs written by hand (text, many pages, a
decompression bomb), Word documents through python-docx, and hostile zips."""

from __future__ import annotations

import io
import zipfile
import zlib

import docx


def _pdf(objects: list[bytes]) -> bytes:
    """A PDF of ``objects`` (object n is objects[n - 1]; 1 is the catalog), with a true xref."""
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.write(b"".join(b"%010d 00000 n \n" % o for o in offsets))
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def _stream(data: bytes, extra: bytes = b"") -> bytes:
    return b"<< /Length %d %s>>\nstream\n%s\nendstream" % (len(data), extra, data)


def _escape(line: str) -> bytes:
    return line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)").encode("latin-1")


_FONT = b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"


def pdf(pages: list[list[str]], title: str = "") -> bytes:
    """A PDF whose pages show these lines in Helvetica (text pypdf reads back)."""
    count = len(pages)
    kids = b" ".join(b"%d 0 R" % (5 + 2 * i) for i in range(count))
    info = b"<< /Title (%s) >>" % _escape(title)
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, count)]
    objects += [_FONT, info]
    for i, lines in enumerate(pages):
        shown = b" ".join(b"(%s) Tj T*" % _escape(line) for line in lines)
        content = b"BT /F1 12 Tf 72 720 Td 14 TL " + shown + b" ET"
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            b"/Contents %d 0 R >>" % (6 + 2 * i)
        )
        objects.append(_stream(content))
    made = _pdf(objects)
    return made.replace(b"/Root 1 0 R", b"/Root 1 0 R /Info 4 0 R")


def many_pages_pdf(count: int) -> bytes:
    """A valid PDF of ``count`` pages that all share one small content stream."""
    kids = b" ".join(b"%d 0 R" % (5 + i) for i in range(count))
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, count)]
    objects += [_FONT, _stream(b"BT /F1 12 Tf 72 720 Td (page) Tj ET")]
    page = b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
    page += b"/Contents 4 0 R >>"
    objects += [page] * count
    return _pdf(objects)


def pdf_bomb(unpacked_mb: int = 300) -> bytes:
    """One page whose content stream is a few hundred KB of Flate that unpacks to
    ``unpacked_mb`` MB."""
    packer = zlib.compressobj(1)
    chunk = b" " * (1 << 20)
    packed = packer.compress(b"BT /F1 12 Tf 72 720 Td (bomb) Tj ET ")
    packed += b"".join(packer.compress(chunk) for _ in range(unpacked_mb)) + packer.flush()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [4 0 R] /Count 1 >>", _FONT]
    objects.append(
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
        b"/Contents 5 0 R >>"
    )
    objects.append(_stream(packed, b"/Filter /FlateDecode "))
    return _pdf(objects)


def word(paragraphs: list[str], title: str = "") -> bytes:
    """A real .docx made by python-docx."""
    document = docx.Document()
    document.core_properties.title = title
    for text in paragraphs:
        document.add_paragraph(text)
    table = document.add_table(rows=1, cols=2)
    table.rows[0].cells[0].text = "cell one"
    table.rows[0].cells[1].text = "cell two"
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def word_bomb(unpacked_mb: int = 100) -> bytes:
    """A .docx whose document.xml unpacks to ``unpacked_mb`` MB of spaces (a zip bomb)."""
    base = zipfile.ZipFile(io.BytesIO(word(["x"])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as bomb:
        for item in base.infolist():
            if item.filename != "word/document.xml":
                bomb.writestr(item, base.read(item))
        with bomb.open("word/document.xml", "w", force_zip64=True) as member:
            chunk = b" " * (1 << 20)
            for _ in range(unpacked_mb):
                member.write(chunk)
    return out.getvalue()


def word_with_entities() -> bytes:
    """A .docx whose document.xml declares nested entities (the "billion laughs")."""
    laughs = b'<!ENTITY a0 "ha">' + b"".join(b'<!ENTITY a%d "%s">' % (i, b"&a%d;" % (i - 1) * 10) for i in range(1, 10))
    xml = (
        b'<?xml version="1.0"?><!DOCTYPE w:document [' + laughs + b"]>"
        b'<w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main">'
        b"<w:body><w:p><w:r><w:t>&a9;</w:t></w:r></w:p></w:body></w:document>"
    )
    base = zipfile.ZipFile(io.BytesIO(word(["x"])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as made:
        for item in base.infolist():
            made.writestr(item, xml if item.filename == "word/document.xml" else base.read(item))
    return out.getvalue()


def workbook() -> bytes:
    """A zip laid out like an Excel workbook (not a Word document)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as made:
        made.writestr("[Content_Types].xml", "<Types/>")
        made.writestr("xl/workbook.xml", "<workbook/>")
    return out.getvalue()
