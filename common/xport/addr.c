/* addr.c: "host:port" parsing shared by the backends (IPv4, [IPv6]:port, or a name). */
#include "xport.h"

#include <string.h>

int dm_addr_split(const char *addr, char *host, size_t hostlen, char *port, size_t portlen)
{
	const char *colon, *h = addr;
	size_t hl, pl;

	if (!addr || !host || !port || hostlen == 0 || portlen == 0)
		return -EINVAL;
	if (addr[0] == '[') {
		const char *end = strchr(addr, ']');

		if (!end || end[1] != ':')
			return -EINVAL;
		h = addr + 1;
		hl = (size_t)(end - h);
		colon = end + 1;
	} else {
		colon = strrchr(addr, ':');
		if (!colon || memchr(addr, ':', (size_t)(colon - addr)))
			return -EINVAL;   /* bare IPv6 needs brackets */
		hl = (size_t)(colon - addr);
	}
	pl = strlen(colon + 1);
	if (hl >= hostlen || pl == 0 || pl >= portlen || strspn(colon + 1, "0123456789") != pl)
		return -EINVAL;
	memcpy(host, h, hl);
	host[hl] = '\0';
	memcpy(port, colon + 1, pl + 1);
	return 0;
}
