/* dm.h: the few definitions every dmann file uses: container_of, likely/unlikely, the error
 * convention and logging.
 *
 * Error convention (one for the whole project):
 *   - int functions return 0 (or a non-negative count) on success, -errno on failure;
 *     -EAGAIN means back-pressure (try again later), never a hard failure;
 *   - constructors return a pointer, or NULL with errno set;
 *   - functions that cannot fail return void.
 */
#ifndef DM_H
#define DM_H

#include <stddef.h>
#include <stdint.h>
#include <stdbool.h>
#include <errno.h>

#define container_of(ptr, type, member) \
	((type *)((char *)(ptr) - offsetof(type, member)))

#define dm_likely(x)   __builtin_expect(!!(x), 1)
#define dm_unlikely(x) __builtin_expect(!!(x), 0)
#define DM_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define DM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define DM_MAX(a, b) ((a) > (b) ? (a) : (b))
#define DM_ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

enum dm_log_level { DM_LOG_ERROR = 0, DM_LOG_WARN, DM_LOG_INFO, DM_LOG_DEBUG };

/* Messages at or below the level go to stderr; the level is read once from DMANN_LOG
 * (error|warn|info|debug), default warn, and can be changed with dm_log_set_level. */
void dm_log_set_level(enum dm_log_level level);
enum dm_log_level dm_log_get_level(void);
void dm_log(enum dm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define dm_err(...)   dm_log(DM_LOG_ERROR, __VA_ARGS__)
#define dm_warn(...)  dm_log(DM_LOG_WARN, __VA_ARGS__)
#define dm_info(...)  dm_log(DM_LOG_INFO, __VA_ARGS__)
#define dm_debug(...) dm_log(DM_LOG_DEBUG, __VA_ARGS__)

/* Monotonic clock in nanoseconds. */
uint64_t dm_now_ns(void);

#endif /* DM_H */
