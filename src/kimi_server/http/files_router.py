"""The Files API: ``/v1/files`` (upload, list), ``/v1/files/{file_id}`` (look up, delete) and
``/v1/files/{file_id}/content`` (the extracted text, or the image or video as uploaded). Thin:
the work is in ``files/service.py``; every route answers only about the calling key's files."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import Response

from kimi_server.files.service import FileService
from kimi_server.files.store import StoredFile
from kimi_server.gate.auth import Principal
from kimi_server.http.state import authenticated
from kimi_server.protocol.common import ErrorBody
from kimi_server.protocol.files import FileContent, FileDeleted, FileList, FileObject

router = APIRouter(tags=["Files"])
_ERRORS: dict[int | str, dict[str, Any]] = {401: {"model": ErrorBody}, 404: {"model": ErrorBody}}
_UPLOAD_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "a bad purpose or name, a file that cannot be read, a quota reached"},
    401: {"model": ErrorBody},
    413: {"model": ErrorBody, "description": "the file, or the key's or server's storage, is over its limit"},
    503: {"model": ErrorBody, "description": "every extraction slot stayed busy"},
}


def files_of(request: Request) -> FileService:
    service: FileService = request.app.state.kimi_files
    return service


def _wire(stored: StoredFile) -> FileObject:
    return FileObject(
        id=stored.id,
        bytes=stored.bytes,
        created_at=stored.created_at,
        filename=stored.filename,
        purpose=stored.purpose,  # type: ignore[arg-type]  # stored only after check_purpose
        status_details=stored.status_details,
    )


@router.post("/v1/files", response_model=FileObject, responses=_UPLOAD_ERRORS)
async def upload_file(
    request: Request,
    file: Annotated[UploadFile, File(description="The file; its name is kept as a label.")],
    purpose: Annotated[str, Form(description="`file-extract` (PDF, .docx, HTML, text), `image` or `video`.")],
    principal: Principal = Depends(authenticated),
) -> FileObject:
    """Uploads a file. `file-extract`: its text is extracted at once (read it from
    `/v1/files/{file_id}/content`); `image` / `video`: checked as media parts are, then usable
    as `ms://<file_id>` in image and video parts."""
    stored = await files_of(request).upload(principal.key_id, file.file, file.filename, purpose)
    return _wire(stored)


@router.get("/v1/files", response_model=FileList, responses={401: {"model": ErrorBody}})
async def list_files(
    request: Request,
    purpose: Annotated[str | None, Query(description="Only files of this purpose.")] = None,
    after: Annotated[str | None, Query(description="The id after which the page starts.")] = None,
    limit: Annotated[int | None, Query(ge=1, le=10000, description="At most this many files.")] = None,
    principal: Principal = Depends(authenticated),
) -> FileList:
    """The calling key's files, newest first."""
    page = await files_of(request).page(principal.key_id, purpose, after, limit)
    return FileList(data=[_wire(f) for f in page.files], has_more=page.has_more)


@router.get("/v1/files/{file_id}", response_model=FileObject, responses=_ERRORS)
async def retrieve_file(request: Request, file_id: str, principal: Principal = Depends(authenticated)) -> FileObject:
    """One of the calling key's files; another key's is a 404."""
    return _wire(await files_of(request).get(principal.key_id, file_id))


@router.delete("/v1/files/{file_id}", response_model=FileDeleted, responses=_ERRORS)
async def delete_file(request: Request, file_id: str, principal: Principal = Depends(authenticated)) -> FileDeleted:
    """Deletes one of the calling key's files, its text with it."""
    await files_of(request).delete(principal.key_id, file_id)
    return FileDeleted(id=file_id)


@router.get(
    "/v1/files/{file_id}/content",
    response_model=FileContent,
    responses={
        **_ERRORS,
        200: {
            "description": "`file-extract`: the text as JSON; `image` / `video`: the bytes as uploaded.",
            "content": {"image/*": {}, "video/*": {}},
        },
    },
)
async def file_content(request: Request, file_id: str, principal: Principal = Depends(authenticated)) -> Any:
    """The extracted text of a `file-extract` file, as `{"content", "file_type", "filename",
    "title", "type"}` (put `content`, or the whole answer, in a system message); an image or
    video file's bytes as uploaded."""
    service = files_of(request)
    stored = await service.get(principal.key_id, file_id)
    if stored.purpose != "file-extract":
        return Response(await service.data(principal.key_id, stored), media_type=stored.file_type)
    text = await service.text(principal.key_id, stored)
    return FileContent(content=text, file_type=stored.file_type, filename=stored.filename, title=stored.title)
