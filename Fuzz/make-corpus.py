#!/usr/bin/env python3
"""Writes the seed corpora (Fuzz/Corpus/<target>/) and the hostile regression inputs
(Tests/Fixtures/fuzz-regressions/<decoder>/) from the wire formats of docs/WIRE-FORMAT.md and the
payload shapes of Sources/IPCSecureCoding. Deterministic: run it again after changing it and commit
the output. Inputs that a fuzzer found are saved by hand next to these and are not written here."""

import os
import shutil
import struct

ROOT = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(ROOT, "Corpus")
FIXTURES = os.path.join(ROOT, "..", "Tests", "Fixtures", "fuzz-regressions")

MESSAGE, REQUEST, REPLY, FAILURE = 1, 2, 3, 4


def binary_frame(kind, msgid=0, correlation=0, payload=b"", length=None):
    length = len(payload) if length is None else length
    return b"IP\x01" + bytes([kind]) + struct.pack(">IQI", msgid, correlation, length) + payload


def http_frame(kind, msgid=0, correlation=0, payload=b""):
    start = {
        MESSAGE: b"POST /ipc HTTP/1.1\r\nHost: ipcbench\r\n",
        REQUEST: b"POST /ipc HTTP/1.1\r\nHost: ipcbench\r\n",
        REPLY: b"HTTP/1.1 200 OK\r\n",
        FAILURE: b"HTTP/1.1 500 Internal Server Error\r\n",
    }[kind]
    token = {MESSAGE: b"message", REQUEST: b"request", REPLY: b"reply", FAILURE: b"failure"}[kind]
    return (
        start
        + b"Content-Length: %d\r\nIPC-Kind: %s\r\nIPC-Msgid: %d\r\nIPC-Correlation: %d\r\n\r\n" % (len(payload), token, msgid, correlation)
        + payload
    )


# ---------------------------------------------------------------------------------------------
# Framing

BINARY_SEEDS = {
    "request-hello": binary_frame(REQUEST, 7, 42, b"hello"),
    "reply-ok": binary_frame(REPLY, 7, 42, b"ok"),
    "message-empty": binary_frame(MESSAGE),
    "failure-text": binary_frame(FAILURE, 1, 2, b"handler failed"),
    "two-frames": binary_frame(REQUEST, 7, 42, b"hello") + binary_frame(REPLY, 7, 42, b"ok"),
    "max-ids": binary_frame(MESSAGE, 0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF, b"x"),
    "payload-512": binary_frame(MESSAGE, 1, 1, bytes(range(256)) * 2),
    "payload-513": binary_frame(MESSAGE, 1, 1, b"\x00" * 513),
    "header-only": binary_frame(REQUEST, 7, 42, b"hello")[:20],
    "half-header": binary_frame(REQUEST, 7, 42)[:10],
}

BINARY_HOSTILE = {
    "length-ffffffff": binary_frame(REQUEST, 7, 42, length=0xFFFFFFFF),
    "length-7fffffff": binary_frame(REQUEST, 7, 42, length=0x7FFFFFFF),
    "bad-magic": b"PI\x01\x02" + b"\x00" * 16,
    "bad-second-magic-byte": b"I\x00",
    "version-2": b"IP\x02\x02" + b"\x00" * 16,
    "kind-0": b"IP\x01\x00" + b"\x00" * 16,
    "kind-255": b"IP\x01\xff" + b"\x00" * 16,
    "truncated-payload": binary_frame(REQUEST, 7, 42, b"hello")[:23],
    "nul-bytes": b"\x00" * 64,
    "flood-of-empty-frames": binary_frame(MESSAGE) * 200,
    "garbage-after-frame": binary_frame(REPLY, 1, 1, b"ok") + b"GET / HTTP/1.1\r\n\r\n",
}

HTTP_REQUEST = http_frame(REQUEST, 7, 42, b"hello")
HTTP_REPLY = http_frame(REPLY, 7, 42, b"ok")
CURL = (
    b"POST /echo HTTP/1.1\r\nHost: localhost\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n"
    b"Content-Length: 5\r\nContent-Type: application/x-www-form-urlencoded\r\n\r\nhello"
)

HTTP_SEEDS = {
    "request-hello": HTTP_REQUEST,
    "reply-ok": HTTP_REPLY,
    "failure": http_frame(FAILURE, 1, 2, b"handler failed"),
    "message-empty": http_frame(MESSAGE),
    "curl": CURL,
    "no-content-length": b"GET / HTTP/1.1\r\n\r\n",
    "pipelined": HTTP_REQUEST + http_frame(MESSAGE, 1, 0, b"x") + HTTP_REPLY,
    "status-404-empty-reason": b"HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n",
    "mixed-case-fields": b"PUT /x HTTP/1.1\r\ncOnTeNt-LeNgTh: 3\r\nipc-kind: message\r\nIPC-MSGID:\t9 \r\n\r\nabc",
    "leading-zeros": b"POST / HTTP/1.1\r\nContent-Length: 0003\r\nIPC-Correlation: 0018446744073709551615\r\n\r\nabc",
    "obs-text-reason": b"HTTP/1.1 200 \xc3\xa9t\xc3\xa9\r\nContent-Length: 0\r\n\r\n",
}

HTTP_HOSTILE = {
    "duplicate-content-length": b"POST / HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
    "transfer-encoding-chunked": b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    "content-length-and-transfer-encoding": b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: identity\r\n\r\nhello",
    "nul-in-header": b"POST / HTTP/1.1\r\nX-Note: a\x00b\r\n\r\n",
    "bare-lf": b"POST / HTTP/1.1\nContent-Length: 0\n\n",
    "cr-without-lf": b"POST / HTTP/1.1\r\rContent-Length: 0\r\n\r\n",
    "split-crlf-at-end": b"POST / HTTP/1.1\r",
    "obs-fold": b"POST / HTTP/1.1\r\nX-Long: a\r\n b\r\n\r\n",
    "http-1.0": b"POST / HTTP/1.0\r\n\r\n",
    "response-without-content-length": b"HTTP/1.1 200 OK\r\nIPC-Kind: reply\r\n\r\n",
    "content-length-huge": b"POST / HTTP/1.1\r\nContent-Length: 4294967295\r\n\r\n",
    "content-length-overflow": b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    "content-length-negative": b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    "content-length-list": b"POST / HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\nhello",
    "content-length-plus": b"POST / HTTP/1.1\r\nContent-Length: +5\r\n\r\nhello",
    "msgid-overflow": b"POST / HTTP/1.1\r\nIPC-Msgid: 4294967296\r\n\r\n",
    "kind-contradicts-start-line": b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nIPC-Kind: request\r\n\r\n",
    "interim-100": b"HTTP/1.1 100 Continue\r\n\r\n",
    "status-600": b"HTTP/1.1 600 Nope\r\nContent-Length: 0\r\n\r\n",
    "space-before-colon": b"POST / HTTP/1.1\r\nContent-Length : 5\r\n\r\nhello",
    "whitespace-before-start-line": b" POST / HTTP/1.1\r\n\r\n",
    "empty-line-first": b"\r\nPOST / HTTP/1.1\r\n\r\n",
    "double-space-request-line": b"POST  / HTTP/1.1\r\n\r\n",
    "header-block-16k": b"POST / HTTP/1.1\r\nX-Pad: " + b"a" * 16400 + b"\r\n\r\n",
    "header-line-256": b"POST / HTTP/1.1\r\nX-Pad: " + b"a" * 256 + b"\r\n\r\n",
    "truncated-body": HTTP_REQUEST[:-2],
    "del-byte": b"POST / HTTP/1.1\r\nX: \x7f\r\n\r\n",
}

# ---------------------------------------------------------------------------------------------
# Payloads

ORDER_JSON = (
    b'{"type":"ipcbench.Order","value":{"attachment":"ABEiM0RVZneImaq7zN3u\\/w==","id":4242001,'
    b'"customer":"Ada Lovelace","items":[{"quantity":1,"sku":"SKU-100000","unitPriceCents":1000}],'
    b'"placedAt":757382400,"tags":["priority","gift"]}}'
)
EMPTY_ORDER_JSON = b'{"type":"ipcbench.Order","value":{"customer":"","placedAt":0,"attachment":"","id":1,"items":[],"tags":[]}}'

JSON_SEEDS = {
    "order": ORDER_JSON,
    "order-empty": EMPTY_ORDER_JSON,
    "list": b'{"type":"ipcbench.MessageList","value":[' + EMPTY_ORDER_JSON + b"]}",
    "list-nested": b'{"type":"ipcbench.MessageList","value":[{"type":"ipcbench.MessageList","value":[' + EMPTY_ORDER_JSON + b"]}]}",
    "list-empty": b'{"type":"ipcbench.MessageList","value":[]}',
    "disallowed-type": b'{"type":"test.Ping","value":{"sequence":1}}',
    "whitespace-escapes": b' { "type" : "ipcbench.\\u004Frder" , "value" : {"customer":"\\ud83d\\ude00","placedAt":-1.5e3,"attachment":"","id":0,"items":[],"tags":[""]} } ',
}

JSON_HOSTILE = {
    "deep-arrays": b"[" * 5000 + b"]" * 5000,
    "deep-in-value": b'{"type":"ipcbench.Order","value":' + b'{"a":' * 40 + b"1" + b"}" * 41,
    "deep-lists": b'{"type":"ipcbench.MessageList","value":[' * 20 + b"]}" * 20,
    "utf16-bom": b"\xfe\xff\x00{\x00}",
    "utf32-le": b'{\x00\x00\x00}\x00\x00\x00',
    "nul-byte": b'{"type":"ipcbench.Order\x00"}',
    "unclosed-string-brackets": b'{"type":"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[',
    "close-before-open": b"]]]]{",
    "id-overflow": b'{"type":"ipcbench.Order","value":{"customer":"","placedAt":0,"attachment":"","id":18446744073709551616,"items":[],"tags":[]}}',
    "id-negative": b'{"type":"ipcbench.Order","value":{"customer":"","placedAt":0,"attachment":"","id":-1,"items":[],"tags":[]}}',
    "date-huge": b'{"type":"ipcbench.Order","value":{"customer":"","placedAt":1e309,"attachment":"","id":1,"items":[],"tags":[]}}',
    "bad-base64": b'{"type":"ipcbench.Order","value":{"customer":"","placedAt":0,"attachment":"!!!","id":1,"items":[],"tags":[]}}',
    "type-not-string": b'{"type":["ipcbench.Order"],"value":{}}',
    "lone-surrogate": b'{"type":"\\ud800","value":1}',
    "invalid-utf8": b'{"type":"\xff\xfe\xc0\x80"}',
}

PLIST_HEAD = b'<?xml version="1.0" encoding="UTF-8"?>\n<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">\n'
EMPTY_ORDER_PLIST_VALUE = (
    b"<dict><key>attachment</key><data></data><key>customer</key><string></string><key>id</key><integer>1</integer>"
    b"<key>items</key><array/><key>placedAt</key><date>2001-01-01T00:00:00Z</date><key>tags</key><array/></dict>"
)
ORDER_PLIST_VALUE = (
    b"<dict><key>attachment</key><data>ABEiM0RVZneImaq7zN3u/w==</data><key>customer</key><string>Ada Lovelace</string>"
    b"<key>id</key><integer>4242001</integer><key>items</key><array><dict><key>quantity</key><integer>1</integer>"
    b"<key>sku</key><string>SKU-100000</string><key>unitPriceCents</key><integer>1000</integer></dict></array>"
    b"<key>placedAt</key><date>2025-01-01T00:00:00Z</date><key>tags</key><array><string>gift</string></array></dict>"
)


def plist_envelope(type_name, value, head=PLIST_HEAD):
    return head + b'<plist version="1.0"><dict><key>type</key><string>' + type_name + b"</string><key>value</key>" + value + b"</dict></plist>"


PLIST_SEEDS = {
    "order": plist_envelope(b"ipcbench.Order", ORDER_PLIST_VALUE),
    "order-empty-no-prologue": plist_envelope(b"ipcbench.Order", EMPTY_ORDER_PLIST_VALUE, head=b""),
    "list": plist_envelope(b"ipcbench.MessageList", b"<array><dict><key>type</key><string>ipcbench.Order</string><key>value</key>" + EMPTY_ORDER_PLIST_VALUE + b"</dict></array>"),
    "list-empty": plist_envelope(b"ipcbench.MessageList", b"<array/>"),
    "disallowed-type": plist_envelope(b"test.Ping", b"<dict><key>sequence</key><integer>1</integer></dict>"),
    "comment-and-cdata": b"<?xml version='1.0'?><!-- <dict> --><plist><dict><key>type</key><string><![CDATA[ipcbench.Order]]></string><key>value</key>" + EMPTY_ORDER_PLIST_VALUE + b"</dict></plist>",
}

PLIST_HOSTILE = {
    "deep-arrays": b"<plist>" + b"<array>" * 3000 + b"</array>" * 3000 + b"</plist>",
    "deep-dicts": b"<plist>" + b"<dict><key>a</key>" * 100 + b"<true/>" + b"</dict>" * 100 + b"</plist>",
    "deep-hidden-by-comment": b"<plist><!-- </array></array></array> -->" + b"<array>" * 40 + b"</array>" * 40 + b"</plist>",
    "close-hidden-in-cdata": b"<plist><array><string><![CDATA[</array></array>]]></string>" + b"<array>" * 40 + b"</array>" * 41 + b"</plist>",
    "binary-plist": b"bplist00\xd1\x01\x02Ttype\x10\x01\x08\x0b\x10\x00\x00\x00\x00\x00\x00\x01\x01\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x12",
    "openstep": b'{ type = "ipcbench.Order"; value = { id = 1; }; }',
    "utf16-declared": b'<?xml version="1.0" encoding="UTF-16"?><plist><dict/></plist>',
    "utf16-bom": b"\xff\xfe<\x00p\x00",
    "inline-dtd": b'<?xml version="1.0"?><!DOCTYPE plist [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;">]><plist><string>&b;</string></plist>',
    "external-entity": b'<?xml version="1.0"?><!DOCTYPE plist SYSTEM "file:///etc/passwd"><plist><string>x</string></plist>',
    "nul-byte": b"<plist><string>a\x00b</string></plist>",
    "unterminated-comment": b"<plist><!-- <array><array>",
    "close-before-open": b"<plist></array><array><array></plist>",
    "integer-overflow": plist_envelope(b"ipcbench.Order", EMPTY_ORDER_PLIST_VALUE.replace(b"<integer>1</integer>", b"<integer>99999999999999999999999</integer>")),
    "bad-date": plist_envelope(b"ipcbench.Order", EMPTY_ORDER_PLIST_VALUE.replace(b"2001-01-01T00:00:00Z", b"9999999-99-99T99:99:99Z")),
    "uid-in-codable": plist_envelope(b"ipcbench.Order", b"<dict><key>CF$UID</key><integer>4294967295</integer></dict>"),
}


class UID:
    def __init__(self, value):
        self.value = value


def plist_xml(value):
    if isinstance(value, UID):
        return b"<dict><key>CF$UID</key><integer>%d</integer></dict>" % value.value
    if isinstance(value, bool):
        return b"<true/>" if value else b"<false/>"
    if isinstance(value, int):
        return b"<integer>%d</integer>" % value
    if isinstance(value, float):
        return b"<real>%r</real>" % value
    if isinstance(value, bytes):
        import base64
        return b"<data>" + base64.b64encode(value) + b"</data>"
    if isinstance(value, str):
        return b"<string>" + value.encode() + b"</string>"
    if isinstance(value, list):
        return b"<array>" + b"".join(plist_xml(v) for v in value) + b"</array>" if value else b"<array/>"
    if isinstance(value, dict):
        return b"<dict>" + b"".join(b"<key>" + k.encode() + b"</key>" + plist_xml(v) for k, v in value.items()) + b"</dict>"
    raise TypeError(value)


def keyed_archive(objects, root=1, version=100000, archiver="NSKeyedArchiver"):
    archive = {"$archiver": archiver, "$objects": objects, "$top": {"root": UID(root) if isinstance(root, int) else root}, "$version": version}
    return PLIST_HEAD + b'<plist version="1.0">' + plist_xml(archive) + b"</plist>"


def class_description(name):
    return {"$classes": [name, "NSObject"], "$classname": name}


def order_objects(items=True, date_class="NSDate", array_class="NSArray"):
    """The objects of an archived OrderObject, laid out as NSKeyedArchiver lays them out."""
    objects = [
        "$null",
        {"$class": UID(9), "attachment": UID(8), "customer": UID(2), "id": 4242001, "items": UID(3), "placedAt": UID(6), "tags": UID(13)},
        "Ada Lovelace",
        {"$class": UID(5), "NS.objects": [UID(10)] if items else []},
        b"",
        class_description(array_class),
        {"$class": UID(7), "NS.time": 757382400.0},
        class_description(date_class),
        b"\x00\x11\x22",
        class_description("IPCSecureCoding.OrderObject"),
        {"$class": UID(11), "quantity": 1, "sku": UID(12), "unitPriceCents": 1000},
        class_description("IPCSecureCoding.LineItemObject"),
        "SKU-100000",
        {"$class": UID(5), "NS.objects": [UID(14)]},
        "gift",
    ]
    return objects


def replaced(objects, index, value):
    copy = list(objects)
    copy[index] = value
    return copy


def with_dictionary(keys, values):
    """The order with its tags replaced by an NSDictionary of these keys and values."""
    objects = ORDER_ARCHIVE + [{"$class": UID(16), "NS.keys": keys, "NS.objects": values}, class_description("NSDictionary")]
    return replaced(objects, 1, dict(ORDER_ARCHIVE[1], tags=UID(15)))


ORDER_ARCHIVE = order_objects()
KEYED_ARCHIVE_SEEDS = {
    "order": keyed_archive(ORDER_ARCHIVE),
    "order-no-items": keyed_archive(order_objects(items=False)),
    "order-mutable-array": keyed_archive(order_objects(array_class="NSMutableArray")),
    "order-tags-dictionary": keyed_archive(with_dictionary([UID(2)], [UID(12)])),
    "root-is-array": keyed_archive(ORDER_ARCHIVE, root=3),
    "root-is-string": keyed_archive(ORDER_ARCHIVE, root=2),
}

KEYED_ARCHIVE_HOSTILE = {
    "disallowed-class": keyed_archive(replaced(ORDER_ARCHIVE, 9, class_description("Foundation.NSString"))),
    "disallowed-foundation-class": keyed_archive(replaced(ORDER_ARCHIVE, 5, class_description("NSString"))),
    "disallowed-class-hint": keyed_archive(replaced(ORDER_ARCHIVE, 9, dict(class_description("IPCSecureCoding.OrderObject"), **{"$classhints": ["NSURL"]}))),
    "class-hints-not-strings": keyed_archive(replaced(ORDER_ARCHIVE, 9, dict(class_description("IPCSecureCoding.OrderObject"), **{"$classhints": [1]}))),
    "class-is-not-a-description": keyed_archive(replaced(ORDER_ARCHIVE, 1, dict(ORDER_ARCHIVE[1], **{"$class": UID(2)}))),
    "class-out-of-range": keyed_archive(replaced(ORDER_ARCHIVE, 1, dict(ORDER_ARCHIVE[1], **{"$class": UID(4294967295)}))),
    "reference-out-of-range": keyed_archive(replaced(ORDER_ARCHIVE, 1, dict(ORDER_ARCHIVE[1], customer=UID(1000)))),
    "self-reference": keyed_archive(replaced(ORDER_ARCHIVE, 1, dict(ORDER_ARCHIVE[1], customer=UID(1)))),
    "cycle-through-array": keyed_archive(replaced(ORDER_ARCHIVE, 3, {"$class": UID(5), "NS.objects": [UID(1)]})),
    # 40 arrays, each holding the next.
    "deep-arrays": keyed_archive(["$null", class_description("NSArray")] + [{"$class": UID(1), "NS.objects": [UID(i + 1)]} for i in range(2, 42)] + ["end"], root=2),
    "dictionary-more-keys-than-values": keyed_archive(with_dictionary([UID(2), UID(12)], [UID(12)])),
    "dictionary-null-value": keyed_archive(with_dictionary([UID(2)], [UID(0)])),
    "dictionary-instance-value": keyed_archive(with_dictionary([UID(2)], [UID(3)])),
    "root-not-a-reference": keyed_archive(ORDER_ARCHIVE, root="root"),
    "root-null": keyed_archive(ORDER_ARCHIVE, root=0),
    "wrong-version": keyed_archive(ORDER_ARCHIVE, version=99999),
    "wrong-archiver": keyed_archive(ORDER_ARCHIVE, archiver="NSArchiver"),
    "objects-not-array": PLIST_HEAD + b"<plist><dict><key>$archiver</key><string>NSKeyedArchiver</string><key>$version</key><integer>100000</integer><key>$objects</key><string>x</string><key>$top</key><dict/></dict></plist>",
    "date-wrong-type": keyed_archive(replaced(ORDER_ARCHIVE, 6, {"$class": UID(7), "NS.time": "yesterday"})),
    "string-field-is-instance": keyed_archive(replaced(ORDER_ARCHIVE, 1, dict(ORDER_ARCHIVE[1], customer=UID(3)))),
    "line-item-sku-null": keyed_archive(replaced(ORDER_ARCHIVE, 10, dict(ORDER_ARCHIVE[10], sku=UID(0)))),
    "array-of-null": keyed_archive(replaced(ORDER_ARCHIVE, 3, {"$class": UID(5), "NS.objects": [UID(0), UID(0)]})),
    "negative-uid": keyed_archive(replaced(ORDER_ARCHIVE, 1, dict(ORDER_ARCHIVE[1], customer=UID(-1)))),
    "binary-archive": b"bplist00\xd4\x01\x02\x03\x04",
}

# ---------------------------------------------------------------------------------------------
# The reassembly oracle: a control byte, chunk sizes, then a stream (see its main.swift).


def oracle(stream, sizes=(), receive=False, drain_at_end=False, maximum=2):
    control = (maximum << 6) | (0x20 if drain_at_end else 0) | (0x10 if receive else 0) | len(sizes)
    return bytes([control]) + bytes(s - 1 for s in sizes) + stream


ORACLE_SEEDS = {
    "binary-byte-by-byte": oracle(BINARY_SEEDS["two-frames"]),
    "binary-split-in-header": oracle(BINARY_SEEDS["two-frames"], sizes=(3, 17, 5), receive=True),
    "binary-drain-at-end": oracle(BINARY_SEEDS["two-frames"], sizes=(21,), drain_at_end=True),
    "binary-too-large-max-7": oracle(BINARY_SEEDS["request-hello"] + BINARY_SEEDS["payload-513"], sizes=(2,), maximum=1),
    "binary-max-0": oracle(BINARY_SEEDS["message-empty"] * 3 + BINARY_SEEDS["reply-ok"], sizes=(19, 1), maximum=0),
    "http-split-crlf": oracle(HTTP_SEEDS["pipelined"], sizes=(18, 1, 1, 40), receive=True),
    "http-byte-by-byte": oracle(HTTP_SEEDS["curl"]),
    "http-drain-at-end": oracle(HTTP_SEEDS["pipelined"], sizes=(64, 7), drain_at_end=True, maximum=3),
    "http-refused-late": oracle(HTTP_HOSTILE["duplicate-content-length"], sizes=(36,)),
    "http-header-limit": oracle(HTTP_HOSTILE["header-line-256"], sizes=(159, 1, 2)),
    "garbage": oracle(b"\x00\r\n\r\nIP\x01\x05HTTP/1.1 200 OK\r\n", sizes=(1, 2, 3, 4)),
}

# Binary Codable (docs/WIRE-FORMAT.md section 4): tagged values, composite ones length-prefixed.

BC_MAGIC = b"IPB\x01"
BC_NULL, BC_FALSE, BC_TRUE, BC_INT, BC_UINT, BC_DOUBLE, BC_FLOAT, BC_STRING, BC_DATA, BC_DATE, BC_KEYED, BC_UNKEYED, BC_ENVELOPE = range(13)


def varint(value):
    out = b""
    while value >= 0x80:
        out += bytes([value & 0x7F | 0x80])
        value >>= 7
    return out + bytes([value])


def bc_composite(tag, body):
    return bytes([tag]) + varint(len(body)) + body


def bc_string(text, tag=BC_STRING):
    return bytes([tag]) + varint(len(text)) + text


def bc_int(value, tag=BC_INT):
    return bytes([tag]) + struct.pack("<q" if tag == BC_INT else "<Q", value)


def bc_keyed(entries):
    return bc_composite(BC_KEYED, varint(len(entries)) + b"".join(varint(len(k)) + k + v for k, v in entries))


def bc_unkeyed(elements):
    return bc_composite(BC_UNKEYED, varint(len(elements)) + b"".join(elements))


def bc_envelope(type_name, value):
    return bc_composite(BC_ENVELOPE, varint(len(type_name)) + type_name + value)


def bc_order(items=1, tags=(b"priority", b"gift"), customer=b"Ada Lovelace", attachment=bytes(range(0, 256, 17))):
    line_items = [
        bc_keyed([(b"sku", bc_string(b"SKU-%d" % (100000 + i * 7919 % 900000))), (b"quantity", bc_int(1 + i % 9)), (b"unitPriceCents", bc_int(1000 + i * 37 % 9000))])
        for i in range(items)
    ]
    return bc_keyed([
        (b"id", bc_int(4242001, BC_UINT)), (b"customer", bc_string(customer)), (b"items", bc_unkeyed(line_items)),
        (b"tags", bc_unkeyed([bc_string(t) for t in tags])), (b"placedAt", bytes([BC_DATE]) + struct.pack("<d", 757382400.0)),
        (b"attachment", bc_string(attachment, BC_DATA)),
    ])


def bc_message(type_name, value):
    return BC_MAGIC + bc_envelope(type_name, value)


BC_EMPTY_ORDER = bc_order(items=0, tags=(), customer=b"", attachment=b"")


def bc_nested_lists(levels):
    value = bc_unkeyed([])
    for _ in range(levels - 1):
        value = bc_unkeyed([bc_envelope(b"ipcbench.MessageList", value)])
    return bc_message(b"ipcbench.MessageList", value)


BINARY_CODABLE_SEEDS = {
    "order": bc_message(b"ipcbench.Order", bc_order()),
    "order-3-items": bc_message(b"ipcbench.Order", bc_order(items=3)),
    "order-empty": bc_message(b"ipcbench.Order", BC_EMPTY_ORDER),
    "list": bc_message(b"ipcbench.MessageList", bc_unkeyed([bc_envelope(b"ipcbench.Order", BC_EMPTY_ORDER)])),
    "list-nested": bc_nested_lists(3),
    "list-empty": bc_message(b"ipcbench.MessageList", bc_unkeyed([])),
    "disallowed-type": bc_message(b"test.Ping", bc_keyed([(b"sequence", bc_int(1))])),
    "keys-reversed": bc_message(b"ipcbench.Order", bc_keyed(list(reversed([
        (b"id", bc_int(1, BC_UINT)), (b"customer", bc_string(b"")), (b"items", bc_unkeyed([])), (b"tags", bc_unkeyed([])),
        (b"placedAt", bytes([BC_DATE]) + struct.pack("<d", 0.0)), (b"attachment", bc_string(b"", BC_DATA)),
    ])))),
}

BC_HUGE = varint(1 << 62)
BINARY_CODABLE_HOSTILE = {
    "deep-lists": bc_nested_lists(40),
    "string-length-huge": bc_message(b"ipcbench.Order", bytes([BC_STRING]) + BC_HUGE + b"abc"),
    "keyed-count-huge": bc_message(b"ipcbench.Order", bc_composite(BC_KEYED, BC_HUGE + b"\x01a\x00")),
    "unkeyed-count-huge": bc_message(b"ipcbench.MessageList", bc_composite(BC_UNKEYED, BC_HUGE + b"\x00")),
    "body-length-huge": BC_MAGIC + bytes([BC_ENVELOPE]) + BC_HUGE + b"\x00",
    "varint-overlong": bc_message(b"ipcbench.Order", bytes([BC_STRING]) + b"\xff" * 12 + b"\x01"),
    "invalid-utf8": bc_message(b"ipcbench.Order", bc_order(customer=b"Ada \xc0\x80 \xed\xa0\x80")),
    "invalid-utf8-type": bc_message(b"ipcbench.\xff", BC_EMPTY_ORDER),
    "id-negative": bc_message(b"ipcbench.Order", BC_EMPTY_ORDER.replace(bc_int(1, BC_UINT), bc_int(-1))),
    "trailing-bytes": bc_message(b"ipcbench.Order", BC_EMPTY_ORDER) + b"\x00",
    "unknown-tag": bc_message(b"ipcbench.Order", b"\x42"),
    "truncated": bc_message(b"ipcbench.Order", bc_order())[:-5],
}

# ---------------------------------------------------------------------------------------------
# Dictionaries

BINARY_TOKENS = [b"IP\x01", b"IP\x01\x01", b"IP\x01\x02", b"IP\x01\x03", b"IP\x01\x04", b"\x00\x00\x02\x00", b"\x00\x00\x02\x01", b"\xff\xff\xff\xff", b"\x00\x00\x00\x00\x00\x00\x00\x00"]
HTTP_TOKENS = [
    b"POST /ipc HTTP/1.1\r\n", b"HTTP/1.1 200 OK\r\n", b"HTTP/1.1 500 Internal Server Error\r\n", b"HTTP/1.1 ", b"HTTP/1.0", b"HTTP/",
    b"\r\n", b"\r\n\r\n", b"\r", b"\n", b": ", b":", b" ", b"\t", b"\x00", b"\x7f",
    b"Content-Length:", b"Content-Length: 0\r\n", b"Content-Length: 5\r\n", b"content-length", b"Transfer-Encoding: chunked\r\n",
    b"Host: ipcbench\r\n", b"IPC-Kind:", b"IPC-Kind: message\r\n", b"IPC-Kind: request\r\n", b"IPC-Kind: reply\r\n", b"IPC-Kind: failure\r\n",
    b"IPC-Msgid:", b"IPC-Msgid: 4294967295\r\n", b"IPC-Correlation:", b"IPC-Correlation: 18446744073709551615\r\n",
    b"100", b"199", b"200", b"299", b"300", b"404", b"500", b"599", b"600", b"4294967296", b"9223372036854775807", b"9223372036854775808",
]
JSON_TOKENS = [
    b'"type"', b'"value"', b'"ipcbench.Order"', b'"ipcbench.MessageList"', b'"test.Ping"',
    b'"id"', b'"customer"', b'"items"', b'"tags"', b'"placedAt"', b'"attachment"', b'"sku"', b'"quantity"', b'"unitPriceCents"',
    b"{", b"}", b"[", b"]", b":", b",", b'"', b"\\", b"\\u0000", b"\\ud800", b"\\/", b"true", b"false", b"null",
    b"-0", b"1e309", b"-1e309", b"0.5", b"18446744073709551615", b"18446744073709551616", b"9223372036854775808", b"\xfe\xff", b"\xef\xbb\xbf",
]
PLIST_TOKENS = [
    b'<?xml version="1.0" encoding="UTF-8"?>', b"<!DOCTYPE plist PUBLIC", b'<plist version="1.0">', b"</plist>", b"<plist>",
    b"<dict>", b"</dict>", b"<dict/>", b"<array>", b"</array>", b"<array/>", b"<key>", b"</key>", b"<string>", b"</string>",
    b"<integer>", b"</integer>", b"<real>", b"</real>", b"<date>", b"</date>", b"<data>", b"</data>", b"<true/>", b"<false/>",
    b"<!--", b"-->", b"<![CDATA[", b"]]>", b"<?", b"?>", b"<!DOCTYPE", b"[", b"&amp;", b"&lt;", b"&#0;", b"&#x10FFFF;",
    b'encoding="UTF-16"', b"bplist00", b"<key>type</key>", b"<key>value</key>", b"<string>ipcbench.Order</string>",
    b"<string>ipcbench.MessageList</string>", b"2001-01-01T00:00:00Z", b"9223372036854775808",
]
BINARY_CODABLE_TOKENS = [
    BC_MAGIC, bytes([BC_ENVELOPE]), bytes([BC_KEYED]), bytes([BC_UNKEYED]), bytes([BC_STRING]), bytes([BC_DATA]), bytes([BC_DATE]),
    bytes([BC_INT]), bytes([BC_UINT]), bytes([BC_DOUBLE]), bytes([BC_FLOAT]), bytes([BC_NULL]), bytes([BC_TRUE]), bytes([BC_FALSE]),
    b"\x0eipcbench.Order", b"\x14ipcbench.MessageList", b"\x09test.Ping", b"\x02id", b"\x08customer", b"\x05items", b"\x04tags",
    b"\x08placedAt", b"\x0aattachment", b"\x03sku", b"\x08quantity", b"\x0eunitPriceCents", b"\x80\x80\x80\x80\x80\x80\x80\x80\x40",
    b"\xff\xff\xff\xff\xff\xff\xff\x7f", b"\x00\x00\x00\x00\x00\x00\x00\x00", b"\xff\xff\xff\xff\xff\xff\xff\xff",
]
KEYED_ARCHIVE_TOKENS = PLIST_TOKENS + [
    b"$archiver", b"$objects", b"$top", b"$version", b"$class", b"$classes", b"$classname", b"$classhints", b"$null",
    b"<key>$class</key>", b"<key>CF$UID</key>", b"<dict><key>CF$UID</key><integer>1</integer></dict>", b"CF$UID",
    b"<string>NSKeyedArchiver</string>", b"<integer>100000</integer>", b"root", b"NS.objects", b"NS.keys", b"NS.time", b"NS.data", b"NS.string",
    b"NSArray", b"NSMutableArray", b"NSDictionary", b"NSMutableDictionary", b"NSDate", b"NSData", b"NSMutableData", b"NSString", b"NSURL",
    b"NSObject", b"NSError", b"NSNumber", b"IPCSecureCoding.OrderObject", b"IPCSecureCoding.LineItemObject", b"4294967295",
]


def dictionary(tokens):
    def escape(token):
        return "".join(chr(b) if 0x20 <= b < 0x7F and b not in (0x22, 0x5C) else "\\x%02X" % b for b in token)
    return "".join('"%s"\n' % escape(t) for t in tokens)


TARGETS = {
    "FuzzBinaryFrameDecoder": (dict(BINARY_SEEDS, **{"hostile-" + k: v for k, v in BINARY_HOSTILE.items()}), BINARY_TOKENS),
    "FuzzHTTPFrameDecoder": (dict(HTTP_SEEDS, **{"hostile-" + k: v for k, v in HTTP_HOSTILE.items() if len(v) <= 4096}), HTTP_TOKENS),
    "FuzzReassemblyOracle": (ORACLE_SEEDS, BINARY_TOKENS + HTTP_TOKENS),
    "FuzzJSONPayload": (dict(JSON_SEEDS, **{"hostile-" + k: v for k, v in JSON_HOSTILE.items() if len(v) <= 4096}), JSON_TOKENS),
    "FuzzPropertyListPayload": (dict(PLIST_SEEDS, **{"hostile-" + k: v for k, v in PLIST_HOSTILE.items() if len(v) <= 4096}), PLIST_TOKENS),
    "FuzzKeyedArchivePayload": (dict(KEYED_ARCHIVE_SEEDS, **{"hostile-" + k: v for k, v in KEYED_ARCHIVE_HOSTILE.items()}), KEYED_ARCHIVE_TOKENS),
    "FuzzBinaryCodablePayload": (dict(BINARY_CODABLE_SEEDS, **{"hostile-" + k: v for k, v in BINARY_CODABLE_HOSTILE.items()}), BINARY_CODABLE_TOKENS),
}

# Fixture folders are named for the decoder the regression test replays them through.
FIXTURE_SETS = {
    "binary": BINARY_HOSTILE,
    "http": HTTP_HOSTILE,
    "json": JSON_HOSTILE,
    "propertyList": PLIST_HOSTILE,
    "keyedArchive": KEYED_ARCHIVE_HOSTILE,
    "binaryCodable": BINARY_CODABLE_HOSTILE,
}


def write_all(folder, files):
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data)


def main():
    for target, (seeds, tokens) in TARGETS.items():
        folder = os.path.join(CORPUS, target)
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        write_all(folder, seeds)
        with open(os.path.join(ROOT, "Dictionaries", target + ".dict"), "w") as f:
            f.write("# libFuzzer dictionary for %s, written by Fuzz/make-corpus.py\n" % target)
            f.write(dictionary(tokens))
    for decoder, files in FIXTURE_SETS.items():
        folder = os.path.join(FIXTURES, decoder)
        os.makedirs(folder, exist_ok=True)
        # Only the generated files are rewritten; inputs a fuzzer found stay.
        write_all(folder, {"hostile-" + k: v for k, v in files.items()})


if __name__ == "__main__":
    main()
