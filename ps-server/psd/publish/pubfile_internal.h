/* What the reader (pubfile.c) and the writer (pubfile_write.c) of a
 * shard's publications share (pubfile.h): file names, the table file's
 * header, the manifest's checksum member. Nothing here is for other
 * modules. */
#ifndef PSD_PUBFILE_INTERNAL_H
#define PSD_PUBFILE_INTERNAL_H

#define PSD__PUB_MANIFEST "manifest.json"
#define PSD__PUB_DENSE "dense.safetensors"
#define PSD__PUB_MAGIC "PSDPUB1\n"
/* u64s after the magic: dim, nrows, nremoved, version, name length. */
#define PSD__PUB_NHEAD 5
/* A table file's bytes besides its name and arrays: magic, header, CRC. */
#define PSD__PUB_FIXED (8 + PSD__PUB_NHEAD * 8 + 4)

/* The manifest's member holding its CRC-32: of its compact, key-sorted
 * JSON without it (psd_fileset_manifest_crc, fileset.h). */
#define PSD__PUB_CRC "crc"

#endif
