"""Files a key uploads (``/v1/files``): kept on disk under the data dir, their text extracted in
a child process with time and memory limits, referred to as ``ms://<file_id>`` in media parts.
See docs/files.md."""
