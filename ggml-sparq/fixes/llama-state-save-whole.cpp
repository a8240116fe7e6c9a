// llama-sparq, a general llama.cpp fix: state files written whole or not at all (see
// llama-state-save-whole.h).
#include "llama-state-save-whole.h"

#include "llama-impl.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <sys/stat.h>
#include <unistd.h>

namespace {
// removes the temporary file unless it was renamed
struct tmp_file {
    std::string path;
    bool keep = false;
    ~tmp_file() {
        if (!keep) {
            unlink(path.c_str());
        }
    }
};
} // namespace

size_t llama_state_save_whole(const char * fn, const char * path, size_t expected,
                              const std::function<size_t(const char * tmp)> & save) {
    if (!path || !*path) {
        LLAMA_LOG_ERROR("%s: the file path is empty\n", fn);
        return 0;
    }
    tmp_file tmp{ std::string(path) + ".partial-" + std::to_string((long) getpid()) };
    const size_t n = save(tmp.path.c_str()); // throws to the caller's handler; tmp is removed
    if (n == 0) {
        return 0;
    }
    const size_t want = expected ? expected : n;
    // the data reached the file: fsync reports a write error the buffered writer's close
    // swallowed (ENOSPC on some file systems), the size a short final flush (EFBIG, ENOSPC)
    FILE * f = fopen(tmp.path.c_str(), "rb");
    if (!f) {
        LLAMA_LOG_ERROR("%s: %s: cannot reopen the written file: %s\n", fn, tmp.path.c_str(), strerror(errno));
        return 0;
    }
    const int synced = fsync(fileno(f));
    const int sync_errno = errno;
    fclose(f);
    struct stat st = {};
    if (stat(tmp.path.c_str(), &st) != 0) {
        LLAMA_LOG_ERROR("%s: %s: %s\n", fn, tmp.path.c_str(), strerror(errno));
        return 0;
    }
    if (synced != 0 || (size_t) st.st_size != want) {
        LLAMA_LOG_ERROR("%s: %s: only %lld of %zu bytes reached the disk (%s); the file was not saved\n", fn, path,
                        (long long) st.st_size, want,
                        synced != 0 ? strerror(sync_errno) : "disk full or file size limit");
        return 0;
    }
    if (rename(tmp.path.c_str(), path) != 0) {
        LLAMA_LOG_ERROR("%s: cannot rename %s to %s: %s\n", fn, tmp.path.c_str(), path, strerror(errno));
        return 0;
    }
    tmp.keep = true;
    return n;
}
