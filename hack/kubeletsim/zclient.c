/*
 * zclient: the interpreter line (#!) of the simulated nvidia-imex / nvidia-imex-ctl zipapps when
 * the kubelet stand-in runs a fork server (hack/kubeletsim/zygote.py).
 *
 * Invoked by the kernel as `zclient <zipapp> args...`. If $KUBELETSIM_ZYGOTE names a reachable
 * fork server, asks it to fork `<zipapp> args...` with this process's environment, working
 * directory and stdin/stdout/stderr, forwards SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to
 * the forked program and exits with its status (re-raising its signal). If this process dies,
 * the server kills the program. Otherwise it execs `$KUBELETSIM_PYTHON -S <zipapp> args...`
 * (default: the PYTHON it was compiled with), exactly what the plain zipapp does.
 *
 * Request: 'B', 8 decimal digits of payload length, payload = cwd NUL argc NUL args NUL...
 * env NUL...; replies: one line {"pid": N}, later one line {"exit": N}.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#ifndef PYTHON
#define PYTHON "python3"
#endif

extern char **environ;
static volatile pid_t child = 0;

static void forward(int sig) {
    if (child > 0) kill(child, sig);
}

static void fallback(int argc, char **argv) {
    const char *py = getenv("KUBELETSIM_PYTHON");
    char **args = calloc((size_t)argc + 3, sizeof(char *));
    if (!py || !*py) py = PYTHON;
    args[0] = (char *)py;
    args[1] = "-S";
    for (int i = 1; i < argc; i++) args[i + 1] = argv[i];
    execv(py, args);
    perror("zclient: exec python");
    _exit(127);
}

static int append(char **buf, size_t *len, size_t *cap, const char *s) {
    size_t n = strlen(s) + 1;
    if (*len + n > *cap) {
        *cap = (*len + n) * 2;
        *buf = realloc(*buf, *cap);
        if (!*buf) return -1;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    return 0;
}

static int read_line(int fd, char *line, size_t size) {
    size_t n = 0;
    while (n + 1 < size) {
        ssize_t r = read(fd, line + n, 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        if (line[n] == '\n') break;
        n++;
    }
    line[n] = 0;
    return 0;
}

int main(int argc, char **argv) {
    const char *path = getenv("KUBELETSIM_ZYGOTE");
    if (argc < 2 || !path || !*path) fallback(argc, argv);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path, sizeof addr.sun_path - 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        if (fd >= 0) close(fd);
        fallback(argc, argv);
    }
    char cwd[4096], count[32], *payload = NULL;
    size_t len = 0, cap = 0;
    if (!getcwd(cwd, sizeof cwd)) strcpy(cwd, "/");
    snprintf(count, sizeof count, "%d", argc - 1);
    append(&payload, &len, &cap, cwd);
    append(&payload, &len, &cap, count);
    for (int i = 1; i < argc; i++) append(&payload, &len, &cap, argv[i]);
    for (char **e = environ; *e; e++) append(&payload, &len, &cap, *e);
    char header[16];
    snprintf(header, sizeof header, "B%08zu", len);

    int fds[3] = {0, 1, 2};
    char control[CMSG_SPACE(sizeof fds)];
    memset(control, 0, sizeof control);
    struct iovec iov = {.iov_base = header, .iov_len = 9};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof control};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(cmsg), fds, sizeof fds);
    if (sendmsg(fd, &msg, 0) != 9) fallback(argc, argv);
    for (size_t sent = 0; sent < len;) {
        ssize_t w = write(fd, payload + sent, len - sent);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            perror("zclient: send");
            return 127;
        }
        sent += (size_t)w;
    }

    char line[128];
    int pid = 0, code = 137;
    if (read_line(fd, line, sizeof line) < 0 || sscanf(line, "{\"pid\": %d}", &pid) != 1) {
        fprintf(stderr, "zclient: no pid from the fork server\n");
        return 127;
    }
    child = pid;
    int sigs[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = forward;
        sigaction(sigs[i], &sa, NULL);
    }
    if (read_line(fd, line, sizeof line) < 0 || sscanf(line, "{\"exit\": %d}", &code) != 1)
        return 137;
    if (code < 0) {
        signal(-code, SIG_DFL);
        raise(-code);
        return 128 - code;
    }
    return code;
}
