"""The playground's document attachment: Kimi's long-document workflow, done by the page's key.

``POST /console/playground/files`` takes a multipart form (``file``; ``key`` for the admin) and
passes the file on through the API itself (``dispatch.py``) as the key the playground sends
with: ``POST /v1/files`` with purpose ``file-extract``, then ``GET /v1/files/{id}/content``. So
the file is that key's own (listed, counted in its quotas, deletable through the Files API) and
read under the same limits, with the same refusals, as any client's upload. The answer holds
both of the API's answers: ``{"file": <the file object>, "content": <the extracted text>}``;
the page sends the content as a system message before the conversation."""

from __future__ import annotations

import json

from fastapi import APIRouter, Depends, Request
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from kimi_server.console.dispatch import Forwarded, forward
from kimi_server.console.playground import refusal, sending_key
from kimi_server.console.session import Viewer, csrf_ok, viewer
from kimi_server.console.upload_body import file_form
from kimi_server.errors import InvalidRequestError, PermissionDeniedError
from kimi_server.http.routes import FILES, PLAYGROUND_FILES

router = APIRouter(include_in_schema=False)


@router.post(PLAYGROUND_FILES)
async def attach(request: Request, who: Viewer = Depends(viewer)) -> Response:
    """The header ``X-CSRF-Token`` carries the session's token, as for ``/send``."""
    if not csrf_ok(who, request.headers.get("x-csrf-token")):
        return refusal(PermissionDeniedError("The page expired: reload it."))
    try:
        async with request.form(max_files=1, max_fields=2) as form:
            key = sending_key(who, form.get("key"))
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise InvalidRequestError("Choose a file to attach.", param="file")
            body = file_form({"purpose": "file-extract"}, "file", upload)
            stored = await forward(request.app, request.scope, FILES, key, body)
            if stored.status != 200:
                return await _as_answered(stored)
            file_object = json.loads(await stored.read())
    except HTTPException as error:  # a form Starlette could not read: its words say why
        return refusal(InvalidRequestError(f"The upload is not a form with one file: {error.detail}", param="file"))
    except InvalidRequestError as error:
        return refusal(error)
    content = await forward(request.app, request.scope, f"{FILES}/{file_object['id']}/content", key, method="GET")
    if content.status != 200:
        return await _as_answered(content)
    return JSONResponse(
        {"file": file_object, "content": json.loads(await content.read())}, headers={"cache-control": "no-store"}
    )


async def _as_answered(answer: Forwarded) -> Response:
    """The API's refusal, passed on as it wrote it (its status, its message naming the field)."""
    return Response(await answer.read(), status_code=answer.status, media_type=answer.content_type)
