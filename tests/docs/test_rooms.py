"""psd's rooms keep to their doors. ps-server/psd/ is split into rooms by
role: the folder itself (the daemon process, named psd/ here) and each
folder under it (shard/, store/, coord/, ...). Each room has one room
header, the header whose top comment says "Rooms it calls: a/, b/." (or
"none."), and this holds every C file of ps-server/psd/ to it:

- internal: a file never includes another room's internal header
  (*_internal.h): that room's files share it, nobody else;
- calls:    a file includes another room's header only when its own room's
            header lists that room among the rooms it calls, and a room
            listed there is one some file of the room does call (so the
            list says what the code does);
- header:   every room has exactly one room header;
- unique:   no two rooms hold a header of the same name (the rooms'
            folders are all on the include path, so "x.h" must name one
            file);
- peer:     psd calls another shard of its job one way, peer/ (peer.h):
            no file outside it makes a channel, runs client calls or
            makes a libpsclient client (cm_channel_new, cm_channel_new_fd,
            cm_client_run, psc__client_new; comments and strings left
            out).

Run: /usr/bin/python3 tests/docs/test_rooms.py [SOURCE_ROOT]
Exit status: 0 when every room keeps to its doors, 1 otherwise (each
breach said as FILE:LINE: RULE: what, or FILE: RULE: what)."""
import os
import re
import sys

from test_layout_rule import strip_c

PSD = "ps-server/psd"
TOP = "psd"  # the name the folder itself goes by among the rooms
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
CALLS = re.compile(r"Rooms it calls:(.*?)\.(?:\s|$)", re.S)
PEER = "peer"
CLIENT = re.compile(
    r"\b(cm_channel_new|cm_channel_new_fd|cm_client_run|psc__client_new)"
    r"\s*\(")


def rooms_of(root):
    """{room: {file name: path relative to root}}: the folder's own files
    under TOP, each folder's under its name."""
    base = os.path.join(root, PSD)
    rooms = {}
    for d, dirs, files in os.walk(base):
        dirs.sort()
        rel = os.path.relpath(d, base).replace(os.sep, "/")
        room = TOP if rel == "." else rel
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                rooms.setdefault(room, {})[f] = os.path.relpath(
                    os.path.join(d, f), root).replace(os.sep, "/")
    return rooms


def top_comment(text):
    """The file's first comment, its leading ' * ' dropped, on one line."""
    m = re.match(r"\s*/\*(.*?)\*/", text, re.S)
    if not m:
        return ""
    lines = [re.sub(r"^\s*\*? ?", "", l) for l in m.group(1).splitlines()]
    return " ".join(lines)


def declared(comment):
    """The rooms a room header says its room calls, or None when it says
    nothing of them."""
    m = CALLS.search(comment)
    if not m:
        return None
    said = re.sub(r"\([^)]*\)", "", m.group(1))
    return set(re.findall(r"\b([a-z][a-z0-9_]*)/", said))


def check(root):
    rooms = rooms_of(root)
    bad = []
    where = {}  # header name -> room
    for room, files in sorted(rooms.items()):
        for f in files:
            if f.endswith(".h"):
                if f in where:
                    bad.append("%s: unique: %s/ holds a header of that name "
                               "too; an include of it is ambiguous"
                               % (files[f], where[f]))
                else:
                    where[f] = room
    calls = {}  # room -> the rooms its header lists
    for room, files in sorted(rooms.items()):
        heads = []
        for f, rel in sorted(files.items()):
            if not f.endswith(".h"):
                continue
            said = declared(top_comment(open(os.path.join(root, rel),
                                             encoding="utf-8").read()))
            if said is not None:
                heads.append(rel)
                calls[room] = said
        if len(heads) != 1:
            bad.append("%s/%s: header: room %s/ has %d room headers (%s); "
                       "exactly one top comment of the room says 'Rooms it "
                       "calls: ...'" % (PSD, "" if room == TOP else room,
                                        room, len(heads),
                                        ", ".join(heads) or "none"))
        for r in sorted(calls.get(room, ())):
            if r not in rooms:
                bad.append("%s: calls: lists %s/, which is no room"
                           % (heads[0], r))
    if PEER not in rooms:
        bad.append("%s/%s/: peer: missing; psd's one way to call a shard "
                   "is gone" % (PSD, PEER))
    used = {}
    for room, files in sorted(rooms.items()):
        for f, rel in sorted(files.items()):
            lines = open(os.path.join(root, rel), encoding="utf-8").read()
            code = strip_c(lines).splitlines()
            for n, line in enumerate(lines.splitlines(), 1):
                m = CLIENT.search(code[n - 1]) if room != PEER else None
                if m:
                    bad.append("%s:%d: peer: %s outside %s/: call the job's "
                               "shards through peer.h" % (rel, n, m.group(1),
                                                          PEER))
                m = INCLUDE.match(line)
                if not m:
                    continue
                name = os.path.basename(m.group(1))
                other = where.get(name)
                if other is None or other == room:
                    continue
                used.setdefault(room, set()).add(other)
                if name.endswith("_internal.h"):
                    bad.append("%s:%d: internal: includes %s, the internal "
                               "header of room %s/; call that room's "
                               "public header" % (rel, n, name, other))
                elif room in calls and other not in calls[room]:
                    bad.append("%s:%d: calls: includes %s of room %s/, which "
                               "%s/'s room header does not list among the "
                               "rooms it calls" % (rel, n, name, other, room))
    for room in sorted(calls):
        for r in sorted(calls[room] - used.get(room, set())):
            if r in rooms:
                bad.append("%s/: calls: its room header lists %s/, but no "
                           "file of it includes a header of %s/; remove it"
                           % (room, r, r))
    return bad, rooms


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    bad, rooms = check(root)
    nfiles = sum(len(f) for f in rooms.values())
    if len(rooms) < 2 or nfiles < 20:
        bad.append("%s: only %d rooms and %d files found: wrong root?"
                   % (PSD, len(rooms), nfiles))
    for b in bad:
        print(b)
    print("test_rooms: %d rooms, %d files, %d breaches"
          % (len(rooms), nfiles, len(bad)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
