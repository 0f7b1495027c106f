/* Status table, thread-local errors, settings, versions, context argument checks. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "cuda/driver.h"

static void status_table_is_complete_and_distinct(void **state) {
    (void)state;
    static const cinfer_status_t all[] = {
#define X(name, value, text) CINFER_STATUS_##name,
        CINFER_STATUS_LIST(X)
#undef X
    };
    size_t n = sizeof all / sizeof all[0];
    assert_true(n >= 10);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal((int)all[i], (int)i); /* codes are dense and stable */
        assert_string_not_equal(cinfer_status_string(all[i]), "unknown status");
        assert_non_null(strstr(cinfer_status_name(all[i]), "CINFER_STATUS_"));
        for (size_t j = 0; j < i; j++) {
            assert_string_not_equal(cinfer_status_string(all[i]), cinfer_status_string(all[j]));
            assert_string_not_equal(cinfer_status_name(all[i]), cinfer_status_name(all[j]));
        }
    }
    assert_string_equal(cinfer_status_string((cinfer_status_t)9999), "unknown status");
    assert_string_equal(cinfer_status_name(CINFER_STATUS_NO_DEVICE), "CINFER_STATUS_NO_DEVICE");
    assert_string_equal(cinfer_status_string(CINFER_STATUS_SUCCESS), "success");
}

static void *set_error_in_thread(void *arg) {
    cinfer__error(CINFER_STATUS_INTERNAL, "thread message %d", *(int *)arg);
    return strdup(cinfer_last_error());
}

static void last_error_is_per_thread(void **state) {
    (void)state;
    assert_int_equal(cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "main %s", "message"),
                     CINFER_STATUS_INVALID_ARGUMENT);
    pthread_t t;
    int value = 7;
    void *thread_text = NULL;
    assert_int_equal(pthread_create(&t, NULL, set_error_in_thread, &value), 0);
    assert_int_equal(pthread_join(t, &thread_text), 0);
    assert_string_equal(thread_text, "thread message 7");
    assert_string_equal(cinfer_last_error(), "main message");
    free(thread_text);
}

static void muted_errors_keep_the_last_message(void **state) {
    (void)state;
    cinfer__error(CINFER_STATUS_INVALID_ARGUMENT, "a caller's failure");
    cinfer__error_mute();
    cinfer__error_mute();
    assert_int_equal(cinfer__error(CINFER_STATUS_UNSUPPORTED, "a fallback's try"),
                     CINFER_STATUS_UNSUPPORTED);
    cinfer__error_unmute();
    assert_int_equal(cinfer__error(CINFER_STATUS_NOT_FOUND, "still muted"),
                     CINFER_STATUS_NOT_FOUND);
    cinfer__error_unmute();
    assert_string_equal(cinfer_last_error(), "a caller's failure");
    cinfer__error_unmute(); /* unbalanced: no effect */
    cinfer__error(CINFER_STATUS_INTERNAL, "after %d", 2);
    assert_string_equal(cinfer_last_error(), "after 2");
}

static void long_messages_are_truncated_not_overflowed(void **state) {
    (void)state;
    size_t n = 100000;
    char *big = malloc(n + 1);
    assert_non_null(big);
    memset(big, 'x', n);
    big[n] = '\0';
    cinfer__error(CINFER_STATUS_COMPILE_ERROR, "%s", big);
    size_t len = strlen(cinfer_last_error());
    assert_true(len > 1000 && len < n);
    free(big);
}

static void versions_agree(void **state) {
    (void)state;
    assert_int_equal(cinfer_version(), CINFER_VERSION);
    char text[32];
    cinfer__fmt(text, sizeof text, "%d.%d.%d", CINFER_VERSION_MAJOR, CINFER_VERSION_MINOR,
                CINFER_VERSION_PATCH);
    assert_string_equal(cinfer_version_string(), text);
}

static void settings_follow_the_environment(void **state) {
    (void)state;
    setenv("CINFER_CACHE_DIR", "/tmp/explicit-cache", 1);
    setenv("XDG_CACHE_HOME", "/tmp/xdg", 1);
    setenv("HOME", "/tmp/home", 1);
    setenv("CINFER_JIT", "off", 1);
    setenv("CINFER_LOG", "2", 1);
    cinfer__settings_reload();
    assert_string_equal(cinfer__settings()->cache_dir, "/tmp/explicit-cache");
    assert_string_equal(cinfer_cache_dir(), "/tmp/explicit-cache");
    assert_false(cinfer__settings()->jit_enabled);
    assert_int_equal(cinfer__settings()->log_level, 2);

    unsetenv("CINFER_CACHE_DIR");
    setenv("CINFER_JIT", "on", 1);
    unsetenv("CINFER_LOG");
    cinfer__settings_reload();
    assert_string_equal(cinfer__settings()->cache_dir, "/tmp/xdg/cinfer");
    assert_true(cinfer__settings()->jit_enabled);
    assert_int_equal(cinfer__settings()->log_level, 0);

    /* a CINFER_LOG that is not 0, 1 or 2 leaves logging quiet (with a warning on stderr) */
    static const char *const bad_logs[] = {"abc", "-3", "7", "1x", "11"};
    for (size_t i = 0; i < sizeof bad_logs / sizeof bad_logs[0]; i++) {
        setenv("CINFER_LOG", bad_logs[i], 1);
        cinfer__settings_reload();
        assert_int_equal(cinfer__settings()->log_level, 0);
    }
    setenv("CINFER_LOG", "1", 1);
    cinfer__settings_reload();
    assert_int_equal(cinfer__settings()->log_level, 1);
    unsetenv("CINFER_LOG");

    unsetenv("XDG_CACHE_HOME");
    cinfer__settings_reload();
    assert_string_equal(cinfer__settings()->cache_dir, "/tmp/home/.cache/cinfer");

    unsetenv("HOME");
    cinfer__settings_reload();
    assert_string_equal(cinfer__settings()->cache_dir, "");
}

static void str_grows_and_formats(void **state) {
    (void)state;
    cinfer__str_t s = {0};
    for (int i = 0; i < 1000; i++)
        cinfer__str_printf(&s, "%d,", i);
    assert_false(s.failed);
    assert_int_equal(strlen(s.data), s.len);
    assert_memory_equal(s.data, "0,1,2,", 6);
    assert_non_null(strstr(s.data, ",999,"));
    char big[2000];
    memset(big, 'y', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    size_t before = s.len;
    cinfer__str_printf(&s, "<%s>", big); /* longer than the small buffer path */
    assert_int_equal(s.len, before + sizeof big + 1);
    cinfer__str_free(&s);
    assert_null(s.data);
}

static void context_arguments_are_checked_before_the_device(void **state) {
    (void)state;
    assert_int_equal(cinfer_context_create(NULL, NULL), CINFER_STATUS_INVALID_ARGUMENT);
    assert_non_null(strstr(cinfer_last_error(), "out"));
    cinfer_context_t *ctx = (cinfer_context_t *)&ctx;
    cinfer_context_options_t bad = CINFER_CONTEXT_OPTIONS_INIT;
    bad.size = 4;
    assert_int_equal(cinfer_context_create(&bad, &ctx), CINFER_STATUS_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(cinfer_last_error(), "CINFER_CONTEXT_OPTIONS_INIT"));
    cinfer_context_options_t negative = CINFER_CONTEXT_OPTIONS_INIT;
    negative.device = -3;
    assert_int_equal(cinfer_context_create(&negative, &ctx), CINFER_STATUS_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(cinfer_last_error(), "options->device = -3"));
    cinfer_context_destroy(NULL); /* a no-op */
}

static void no_driver_is_a_status_not_a_crash(void **state) {
    (void)state;
    const cinfer__cuda_t *cu = NULL;
    cinfer_status_t st = cinfer__cuda_get(&cu);
    cinfer_context_t *ctx = NULL;
    cinfer_status_t cst = cinfer_context_create(NULL, &ctx);
    if (st == CINFER_STATUS_NO_DEVICE) {
        /* The machine of CI: every device call reports NO_DEVICE with a message. */
        assert_null(cu);
        assert_int_equal(cst, CINFER_STATUS_NO_DEVICE);
        assert_non_null(strstr(cinfer_last_error(), "no CUDA"));
        assert_null(ctx);
        cinfer_jit_stats_t stats = CINFER_JIT_STATS_INIT;
        assert_int_equal(cinfer_jit_get_stats(&stats), CINFER_STATUS_SUCCESS);
    } else {
        assert_int_equal(st, CINFER_STATUS_SUCCESS);
        assert_non_null(cu);
        assert_true(cu->device_count > 0);
        assert_int_equal(cst, CINFER_STATUS_SUCCESS);
        cinfer_context_destroy(ctx);
    }
}

static void stats_check_their_size(void **state) {
    (void)state;
    cinfer_jit_stats_t stats = CINFER_JIT_STATS_INIT;
    stats.version = 99;
    assert_int_equal(cinfer_jit_get_stats(&stats), CINFER_STATUS_INVALID_ARGUMENT);
    assert_int_equal(cinfer_jit_get_stats(NULL), CINFER_STATUS_INVALID_ARGUMENT);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_table_is_complete_and_distinct),
        cmocka_unit_test(last_error_is_per_thread),
        cmocka_unit_test(muted_errors_keep_the_last_message),
        cmocka_unit_test(long_messages_are_truncated_not_overflowed),
        cmocka_unit_test(versions_agree),
        cmocka_unit_test(settings_follow_the_environment),
        cmocka_unit_test(str_grows_and_formats),
        cmocka_unit_test(context_arguments_are_checked_before_the_device),
        cmocka_unit_test(no_driver_is_a_status_not_a_crash),
        cmocka_unit_test(stats_check_their_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
