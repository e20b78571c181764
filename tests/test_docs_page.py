"""``/docs`` works offline: Swagger UI's files come from the package, the page references nothing
elsewhere, and the OpenAPI document declares the bearer keys that give Swagger its Authorize button."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from tests.conftest import TEST_KEY, build_app

ADMIN_KEY = "sk-admin-docs-test-0123456789"
REFERENCES = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")


def docs_app(tmp_path: Path, **settings: Any) -> TestClient:
    return TestClient(build_app(tmp_path, admin_key=ADMIN_KEY, **settings))


def test_the_page_and_its_assets_are_served_from_the_package(tmp_path: Path) -> None:
    with docs_app(tmp_path) as c:
        page = c.get("/docs")  # no key: the page is static and asks for one
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert "http://" not in page.text and "https://" not in page.text and "//cdn" not in page.text
        references = REFERENCES.findall(page.text)
        assert {ref.split("?")[0] for ref in references} == {
            "/docs/assets/swagger-ui-bundle.js",
            "/docs/assets/swagger-ui.css",
            "/docs/assets/favicon-32x32.png",
            "/docs/assets/docs.js",
        }
        packaged = resources.files("kimi_server.http").joinpath("swagger")
        for ref in references:
            answer = c.get(ref)
            assert answer.status_code == 200, ref
            name = ref.split("?")[0].rsplit("/", 1)[1]
            assert answer.content == packaged.joinpath(name).read_bytes()
        assert b"SwaggerUIBundle" in c.get("/docs/assets/swagger-ui-bundle.js").content
        script = c.get("/docs/assets/docs.js").text
        assert "documentUrl" in script and "preauthorizeApiKey" in script and "validatorUrl: null" in script
        # only the listed files: no other package file, no way out of the folder.
        for name in ("docs_router.py", "README.md", "..%2Fdocs_router.py", "swagger-ui-bundle.js.map"):
            missing = c.get(f"/docs/assets/{name}")
            assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_openapi_declares_the_keys_each_route_takes(tmp_path: Path) -> None:
    with docs_app(tmp_path) as c:
        assert c.get("/openapi.json").status_code == 401  # the document still needs a key
        answer = c.get("/openapi.json", headers={"Authorization": f"Bearer {TEST_KEY}"})
    assert answer.status_code == 200
    schema = answer.json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["APIKey"]["type"] == "http" and schemes["APIKey"]["scheme"] == "bearer"
    assert schemes["AdminKey"]["type"] == "http" and schemes["AdminKey"]["scheme"] == "bearer"
    operations = {(p, m): op for p, ops in schema["paths"].items() for m, op in ops.items()}
    for (path, method), op in operations.items():
        if path == "/health":
            assert "security" not in op
        elif path.startswith("/admin/"):
            assert op["security"] == [{"AdminKey": []}], (path, method)
        else:
            assert op["security"] == [{"APIKey": []}], (path, method)
    assert ("/v1/chat/completions", "post") in operations and ("/v1/responses", "post") in operations
    assert any(path.startswith("/admin/") for path, _ in operations)
    # the document names no key, no path on this machine.
    assert TEST_KEY not in answer.text and ADMIN_KEY not in answer.text and str(tmp_path) not in answer.text


def test_the_admin_key_the_authorize_dialog_offers_opens_the_document(tmp_path: Path) -> None:
    with docs_app(tmp_path) as c:
        admin = c.get("/openapi.json", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        wrong = c.get("/openapi.json", headers={"Authorization": "Bearer sk-admin-docs-test-wrong"})
        # The admin key opens the document only: the API routes still want an API key.
        models = c.get("/v1/models", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert admin.status_code == 200 and "AdminKey" in admin.json()["components"]["securitySchemes"]
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    assert models.status_code == 401
    with TestClient(build_app(tmp_path / "off")) as c:  # no admin key configured: nothing to match
        assert c.get("/openapi.json", headers={"Authorization": f"Bearer {ADMIN_KEY}"}).status_code == 401


def test_public_docs_opens_the_document_too(tmp_path: Path) -> None:
    with docs_app(tmp_path, public_docs=True) as c:
        assert c.get("/docs").status_code == 200
        schema = c.get("/openapi.json").json()
    assert "APIKey" in schema["components"]["securitySchemes"]
