"""The Files API's wire shapes, as Kimi's platform answers them (and the ``openai`` SDK reads them)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class FileObject(BaseModel):
    id: str = Field(description="The file's id; `ms://<id>` names it in image and video parts.")
    object: Literal["file"] = "file"
    bytes: int = Field(description="The size of the file as uploaded.")
    created_at: int = Field(description="Unix seconds.")
    filename: str = Field(description="The name the client gave it: a label only.")
    purpose: Literal["file-extract", "image", "video"]
    status: Literal["ok"] = Field(
        default="ok", description="Always `ok`: a file that fails its checks is never stored."
    )
    status_details: str = Field(default="", description="Why the text was cut short, where it was.")


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool = Field(
        False, description="Whether `limit` left some out; the next page starts `after` the last id."
    )


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class FileContent(BaseModel):
    """The extracted text of a `file-extract` file, ready to go into a system message whole."""

    content: str
    file_type: str = Field(description="The media type the file's bytes showed, e.g. `application/pdf`.")
    filename: str
    title: str = Field(description="The document's own title, where it names one; else empty.")
    type: Literal["file"] = "file"
