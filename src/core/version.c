#include "core/core.h"

#define CINFER__STR2(x) #x
#define CINFER__STR(x)  CINFER__STR2(x)

int cinfer_version(void) {
    return CINFER_VERSION;
}

const char *cinfer_version_string(void) {
    return CINFER__STR(CINFER_VERSION_MAJOR) "." CINFER__STR(CINFER_VERSION_MINOR) "." CINFER__STR(
        CINFER_VERSION_PATCH);
}
