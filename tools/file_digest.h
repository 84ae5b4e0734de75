/* Digests of whole files by the names MosaicML Streaming gives its hashes (index.json's "hashes"):
 * md5, sha1, sha224..sha512, sha3_224..sha3_512, blake2b, blake2s (OpenSSL's libcrypto, where the
 * build found it) and xxh32, xxh64, xxh3_64, xxh128, xxh3_128 (libxxhash), as lower-case hex the way
 * Python's hexdigest() writes them. */
#ifndef RINGFEED_FILE_DIGEST_H
#define RINGFEED_FILE_DIGEST_H

#include <stddef.h>

/* The digest ALGO of the file open at FD (read from its start) into HEX (CAP >= 129). Returns 0,
 * -ENOTSUP for an algorithm of no such name, -ENOSYS for one of libcrypto's where the build had
 * none, or -errno of a failed read. */
int file_digest(int fd, const char *algo, char *hex, size_t cap);

#endif
