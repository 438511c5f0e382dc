/* Whether an address names this machine (cm_addr_is_local, spec.h):
 * loopback and unspecified literals, this host's name, and any address one
 * of its interfaces holds, a name resolved first; a launcher starts the
 * tasks whose address is local. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* getifaddrs, strncasecmp under -std=c11 */
#endif

#include "spec.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "addr.h"

/* Whether an IPv4 address (network order) is loopback or unspecified;
 * 0.0.0.0 counts because connecting to it reaches this host on Linux. */
static int ipv4_loopback(const unsigned char *a) {
  return a[0] == 127 || (a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == 0);
}

/* Whether an IPv6 address is ::1, :: or an IPv4-mapped loopback. */
static int ipv6_loopback(const unsigned char *a) {
  static const unsigned char mapped[12] = {0, 0, 0, 0, 0,    0,
                                           0, 0, 0, 0, 0xff, 0xff};
  int i;

  for (i = 0; i < 15 && a[i] == 0; i++)
    ;
  if (i == 15 && (a[15] == 1 || a[15] == 0))
    return 1;
  return memcmp(a, mapped, 12) == 0 && ipv4_loopback(a + 12);
}

/* Whether the address (AF_INET: 4 bytes, AF_INET6: 16) is loopback or is
 * held by one of this host's interfaces. *ifs caches getifaddrs() across
 * calls; the caller frees it. */
static int ip_is_local(int family, const unsigned char *a,
                       struct ifaddrs **ifs) {
  const struct ifaddrs *i;
  const unsigned char *b;

  if (family == AF_INET ? ipv4_loopback(a) : ipv6_loopback(a))
    return 1;
  if (!*ifs && getifaddrs(ifs) != 0) {
    *ifs = NULL;
    return 0;
  }
  for (i = *ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != family)
      continue;
    if (family == AF_INET) {
      b = (const unsigned char *)&(
              (const struct sockaddr_in *)(const void *)i->ifa_addr)
              ->sin_addr;
      if (memcmp(a, b, 4) == 0)
        return 1;
    } else {
      b = (const unsigned char *)&(
              (const struct sockaddr_in6 *)(const void *)i->ifa_addr)
              ->sin6_addr;
      if (memcmp(a, b, 16) == 0)
        return 1;
    }
  }
  return 0;
}

/* Compares host names ignoring case and one trailing dot. */
static int same_name(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);

  if (la > 0 && a[la - 1] == '.')
    la--;
  if (lb > 0 && b[lb - 1] == '.')
    lb--;
  return la == lb && strncasecmp(a, b, la) == 0;
}

int cm_addr_is_local(const struct cm_addr *addr) {
  char me[256];
  unsigned char bin[16];
  struct ifaddrs *ifs = NULL;
  struct addrinfo hints, *res = NULL, *ai;
  const unsigned char *a;
  int local = 0;

  if (!addr || !addr->host[0])
    goto out;
  /* Literals first: no lookup at all. */
  if (inet_pton(AF_INET, addr->host, bin) == 1) {
    local = ip_is_local(AF_INET, bin, &ifs);
    goto out;
  }
  if (cm__parse_ipv6(addr->host, bin)) {
    local = ip_is_local(AF_INET6, bin, &ifs);
    goto out;
  }
  if (same_name(addr->host, "localhost")) {
    local = 1;
    goto out;
  }
  if (gethostname(me, sizeof me) == 0) {
    me[sizeof me - 1] = '\0';
    if (same_name(addr->host, me)) {
      local = 1;
      goto out;
    }
  }
  /* A name: resolve it (hosts file or DNS) and look for one of ours. */
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(addr->host, NULL, &hints, &res) != 0) {
    res = NULL;
    goto out;
  }
  for (ai = res; ai && !local; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      a = (const unsigned char *)&(
              (const struct sockaddr_in *)(const void *)ai->ai_addr)
              ->sin_addr;
      local = ip_is_local(AF_INET, a, &ifs);
    } else if (ai->ai_family == AF_INET6) {
      a = (const unsigned char *)&(
              (const struct sockaddr_in6 *)(const void *)ai->ai_addr)
              ->sin6_addr;
      local = ip_is_local(AF_INET6, a, &ifs);
    }
  }
out:
  if (res)
    freeaddrinfo(res);
  if (ifs)
    freeifaddrs(ifs);
  return local;
}
