/*
 * Simulated nvidia-imex-ctl for host-managed IMEX tests: `nvidia-imex-ctl -q --u=<socket>`.
 *
 * The kubelet plugin runs `chroot <driver root> nvidia-imex-ctl -q --u=<socket>`, so inside a
 * fake driver root the client must run without an interpreter or shared libraries: this is
 * built with `gcc -static` (hack/testsupport/hostimex.py) and speaks the line protocol of
 * pkg/imex/sim/wire.py to the simulated host service (pkg/imex/sim/hostservice.py): it sends
 * "READY?", prints the one-line answer and exits 0; an unreachable socket prints the error on
 * stderr and exits 1. The Python simulator (pkg/imex/sim/ctl.py --u) behaves the same.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static int usage(void) {
    fputs("usage: nvidia-imex-ctl -q --u=<socket> (simulated)\n", stderr);
    return 2;
}

int main(int argc, char **argv) {
    const char *path = NULL;
    int query = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-q") == 0) {
            query = 1;
        } else if (strncmp(argv[i], "--u=", 4) == 0) {
            path = argv[i] + 4;
        } else {
            return usage();
        }
    }
    if (!query || path == NULL || *path == '\0') {
        return usage();
    }
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(path) >= sizeof addr.sun_path) {
        fprintf(stderr, "IMEX daemon not reachable: socket path too long: %s\n", path);
        return 1;
    }
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        fprintf(stderr, "IMEX daemon not reachable: %s: %s\n", path, strerror(errno));
        return 1;
    }
    static const char request[] = "READY?\n";
    if (write(fd, request, sizeof request - 1) != (ssize_t)(sizeof request - 1)) {
        fprintf(stderr, "IMEX daemon not reachable: write: %s\n", strerror(errno));
        return 1;
    }
    char line[256];
    size_t used = 0;
    while (used < sizeof line - 1) {
        ssize_t n = read(fd, line + used, 1);
        if (n <= 0) {
            fprintf(stderr, "IMEX daemon not reachable: connection closed before an answer\n");
            return 1;
        }
        if (line[used] == '\n') {
            break;
        }
        used++;
    }
    line[used] = '\0';
    close(fd);
    printf("%s\n", line);
    return 0;
}
