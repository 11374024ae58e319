/* test_s3_hresp.c: the internal client's HTTP response parser (cn/s3/s3_hresp.c): complete
 * and partial responses, keep-alive decisions, and malformed input refused. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "s3_hresp.h"

static int parse(const char *s, bool eof, struct s3_hresp *r)
{
	return s3_hresp_parse(s, strlen(s), eof, r);
}

Test(s3_hresp, complete_with_content_length_keeps_the_connection)
{
	const char *s = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
			"content-length: 7\r\n\r\n{\"h\":1}";
	struct s3_hresp r;

	cr_assert_eq(parse(s, false, &r), 1);
	cr_assert_eq(r.status, 200);
	cr_assert_eq(r.clen, 7);
	cr_assert_eq(r.blen, 7);
	cr_assert_eq(memcmp(r.body, "{\"h\":1}", 7), 0);
	cr_assert(r.keep);
}

Test(s3_hresp, every_prefix_needs_more_bytes)
{
	const char *s = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\n\r\nbusy!";
	struct s3_hresp r;

	for (size_t n = 0; n < strlen(s); n++)
		cr_assert_eq(s3_hresp_parse(s, n, false, &r), 0, "prefix of %zu bytes", n);
	cr_assert_eq(s3_hresp_parse(s, strlen(s), false, &r), 1);
	cr_assert_eq(r.status, 503);
	/* ended early: the body is short */
	cr_assert_eq(s3_hresp_parse(s, strlen(s) - 1, true, &r), -EBADMSG);
	cr_assert_eq(s3_hresp_parse(s, 0, true, &r), -EBADMSG);
}

Test(s3_hresp, close_extra_bytes_http10_and_no_length_are_not_kept)
{
	struct s3_hresp r;

	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
			   false, &r), 1);
	cr_assert_not(r.keep);
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA", false, &r), 1);
	cr_assert_not(r.keep);
	cr_assert_eq(r.blen, 2);
	cr_assert_eq(parse("HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", false, &r), 1);
	cr_assert_not(r.keep);
	/* without a length the body ends with the connection */
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\n\r\nbody", false, &r), 0);
	cr_assert_eq(parse("HTTP/1.1 200 OK\r\n\r\nbody", true, &r), 1);
	cr_assert_eq(r.blen, 4);
	cr_assert_not(r.keep);
}

Test(s3_hresp, malformed_responses_are_refused)
{
	static const char *const bad[] = {
		"HTTP/2.0 200 OK\r\n\r\n",
		"HTTX/1.1 200 OK\r\n\r\n",
		"HTTP/1.1 20x OK\r\n\r\n",
		"HTTP/1.1 099 Low\r\n\r\n",
		"HTTP/1.1 600 High\r\n\r\n",
		"HTTP/1.1 2000 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: -2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length:\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 2x\r\n\r\nok",
		"garbage\r\n\r\n",
	};
	struct s3_hresp r;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(parse(bad[i], false, &r), -EBADMSG, "%s", bad[i]);
}
