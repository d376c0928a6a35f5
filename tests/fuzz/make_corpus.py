"""Write the fuzzer's seed corpus, tests/fuzz/corpus/: small raw replies covering each framing,
each kind of line end, and every error path of the compiled reader (loadgen/engine/_reader.c).
The files are committed; this script says where each came from and rewrites them:

    python tests/fuzz/make_corpus.py

A finding of the fuzzer is added here under a name that says what it broke, with its fix.
"""

from __future__ import annotations

from pathlib import Path

CORPUS = Path(__file__).resolve().parent / "corpus"

CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
CLOSED = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
SSE = b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\ndata: [DONE]\n\n'


def length(body: bytes, n: int | None = None) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(body) if n is None else n) + body


def chunks(body: bytes, size: int = 7, ext: bytes = b"", trailer: bytes = b"") -> bytes:
    out = b"".join(b"%x%s\r\n%s\r\n" % (len(body[i : i + size]), ext, body[i : i + size]) for i in range(0, len(body), size))
    return out + b"0\r\n" + trailer + b"\r\n"


SEEDS: dict[str, bytes] = {
    # valid bodies
    "chunked_lf": CHUNKED + chunks(SSE),
    "chunked_crlf": CHUNKED + chunks(SSE.replace(b"\n", b"\r\n")),
    "chunked_cr": CHUNKED + chunks(SSE.replace(b"\n", b"\r")),
    "chunked_mixed_eol": CHUNKED + chunks(b"a\nb\r\nc\rd\r\r\ne\n"),
    "chunked_cr_last_in_chunk": CHUNKED + chunks(b"data: a\r\ndata: b\r", size=8),
    "chunked_bom": CHUNKED + chunks(b"\xef\xbb\xbf" + SSE, size=2),
    "chunked_bom_cr": CHUNKED + chunks(b"\xef\xbb\xbfdata: x\r\r"),
    "chunked_one_byte_chunks": CHUNKED + chunks(SSE, size=1),
    "chunked_upper_hex_zeros": CHUNKED + b"000A\r\ndata: 1234\r\n0000\r\n\r\n",
    "chunked_extensions": CHUNKED + chunks(SSE, ext=b';a=1;b="x y";c;d="q\\"e"'),
    "chunked_ext_semicolons": CHUNKED + b"5;;x=y;\r\nabcd\n\r\n0;end\r\n\r\n",
    "chunked_trailers": CHUNKED + chunks(SSE, trailer=b"X-Checksum: 1\r\nX-Other:\r\n"),
    "chunked_no_final_eol": CHUNKED + chunks(b"data: a\n\ndata: tail"),
    "chunked_empty": CHUNKED + b"0\r\n\r\n",
    "chunked_crlf_after_end": CHUNKED + chunks(SSE) + b"\r\n",
    "continue_then_chunked": b"HTTP/1.1 100 Continue\r\n\r\n" + CHUNKED + chunks(SSE),
    "identity": length(SSE),
    "identity_crlf": length(SSE.replace(b"\n", b"\r\n")),
    "identity_zero": length(b""),
    "identity_no_final_eol": length(b"data: a\n\ndata: tail"),
    "identity_crlf_after_end": length(SSE) + b"\r\n",
    "close_delimited": CLOSED + SSE,
    "close_delimited_cut_mid_line": CLOSED + SSE + b"data: cu",
    "close_delimited_cr": CLOSED + SSE.replace(b"\n", b"\r"),
    "error_status_body": b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\noverload\n",
    "gzip_python_path": b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc",
    "no_content": b"HTTP/1.1 204 No Content\r\n\r\n",
    # oversize lines (the fuzzer's caps are 16 B, 64 B and 64 KiB)
    "oversize_line_chunked": CHUNKED + chunks(b"data: " + b"x" * 100, size=30),
    "oversize_line_identity": length(b"data: " + b"y" * 100),
    "oversize_line_close": CLOSED + b"data: " + b"z" * 100,
    "oversize_line_cr_mode": CHUNKED + chunks(b"a\rdata: " + b"w" * 100),
    # broken chunk framing: each error of the chunk parser
    "bad_hex_first": CHUNKED + b"zz\r\nabc\r\n",
    "bad_hex_in_size": CHUNKED + b"3g\r\nabc\r\n0\r\n\r\n",
    "size_lf_without_cr": CHUNKED + b"3\nabc\r\n0\r\n\r\n",
    "size_cr_without_lf": CHUNKED + b"3\rabc\r\n0\r\n\r\n",
    "size_overflow": CHUNKED + b"fffffffffffffffff\r\n",
    "size_max_64bit": CHUNKED + b"ffffffffffffffff\r\nabc",
    "ext_name_bad_char": CHUNKED + b"3;a b\r\nabc\r\n0\r\n\r\n",
    "ext_name_lf": CHUNKED + b"3;a\nabc\r\n0\r\n\r\n",
    "ext_value_start_bad": CHUNKED + b"3;a= \r\nabc\r\n0\r\n\r\n",
    "ext_value_bad_char": CHUNKED + b"3;a=b c\r\nabc\r\n0\r\n\r\n",
    "ext_value_lf": CHUNKED + b"3;a=b\nabc\r\n0\r\n\r\n",
    "ext_quoted_cr": CHUNKED + b'3;a="x\r\nabc\r\n0\r\n\r\n',
    "ext_after_quoted_bad": CHUNKED + b'3;a="x"y\r\nabc\r\n0\r\n\r\n',
    "data_longer_than_size": CHUNKED + b"3\r\nabcX\r\n0\r\n\r\n",
    "data_then_lf_only": CHUNKED + b"3\r\nabc\n0\r\n\r\n",
    "data_then_cr_not_lf": CHUNKED + b"3\r\nabc\rX0\r\n\r\n",
    "trailer_starts_with_lf": CHUNKED + b"0\r\n\n",
    "trailer_line_lf": CHUNKED + b"0\r\nX: y\n\r\n",
    "trailer_cr_not_lf": CHUNKED + b"0\r\nX: y\rZ\r\n",
    "end_cr_not_lf": CHUNKED + b"0\r\n\rX",
    "data_after_end_chunked": CHUNKED + chunks(SSE) + b"GARBAGE",
    "second_response_after_end": CHUNKED + chunks(SSE) + length(b"x"),
    "data_after_end_identity": length(SSE) + b"more",
    # truncated bodies
    "truncated_in_size": CHUNKED + b"1",
    "truncated_in_ext": CHUNKED + b'3;a="x',
    "truncated_in_data": CHUNKED + b"20\r\ndata: half",
    "truncated_before_data_crlf": CHUNKED + b"3\r\nabc",
    "truncated_in_trailers": CHUNKED + b"0\r\nX: y\r\n",
    "truncated_identity": length(SSE, len(SSE) + 10),
    # the fuzzer's findings (each with its fix)
    # Connection: close after a 100 Continue: the parser kept the 100's keep-alive answer, so the
    # compiled path reused a closed connection; a reply after a 1xx is now read on the Python path.
    "found_continue_then_close": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n"
    b"Connection: close\r\n\r\nabc",
    "found_continue_then_close_delimited": b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\ndata: x\n\n",
    # "chunked" then a tab is another coding to llhttp (the body runs to the close), but the
    # compiled path took it for chunked (str.strip); only trailing spaces are stripped now.
    "found_te_chunked_then_tab": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\t\r\n\r\n5\r\ndata:\r\n0\r\n\r\n",
    "te_chunked_then_spaces": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked  \r\n\r\n5\r\ndata:\r\n0\r\n\r\n",
    # the known difference (tests/fuzz/reader_oracle.py, KNOWN): keep-alive after a Connection trailer
    "known_trailer_connection_close": CHUNKED + chunks(SSE, trailer=b"Connection: close\r\n"),
    "known_trailer_transfer_encoding": CHUNKED + b"0\r\nTransfer-Encoding: gzip\r\n\r\n",
    "known_trailer_transfer_encoding_cut": CHUNKED + b"0\r\nTransfer-Encoding: gzip\r\nns",
    "trailer_content_length": CHUNKED + chunks(SSE, trailer=b"Content-Length: 5\r\n"),
    "trailer_special_name_space": CHUNKED + b"0\r\nUpgrade :x\r\n\r\n",
    "trailer_fold": CHUNKED + b"0\r\nX: a\r\n b\r\n\r\n",
    "trailer_empty_value": CHUNKED + b"0\r\nX:\r\nY: \t\r\n\r\n",
    "ext_quoted_pair_bad": CHUNKED + b'3;a="\\\x00"\r\nabc\r\n0\r\n\r\n',
    "ext_empty_name_and_value": CHUNKED + b"3;=;a=\r\nabc\r\n0\r\n\r\n",
    "ext_trailing_semicolon": CHUNKED + b"3;a;\r\nabc\r\n0\r\n\r\n",
    "close_header_data_after_end": b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nabcX",
}


def main() -> None:
    CORPUS.mkdir(exist_ok=True)
    for name, reply in SEEDS.items():
        (CORPUS / f"{name}.http").write_bytes(reply)
    print(f"{len(SEEDS)} seeds in {CORPUS}")


if __name__ == "__main__":
    main()
