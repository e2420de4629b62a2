"""Auth scenarios: users, roles, permissions, enable/disable and what a user may do.

Auth is cluster-wide, so these run last and leave auth off and no users or roles behind.
They keep to what etcd 3.5.1 and Concord agree on; the rules etcd tightened in 3.5.28
(nested txns, Status, MemberList, Compact, leases) are covered by Concord's own tests.
"""

from __future__ import annotations

from .dsl import S, TXN, W, scenario, txn_input

ROOT = "--user root:rootpw"
U1 = "--user u1:p1"


def build_auth_scenarios() -> None:
    scenario("auth_users_roles_permissions",
             "auth enable",                                     # no root user yet
             "user add root:rootpw",
             "user add root:again",                             # exists
             "user add u1:p1",
             "user add u2 --no-password",
             "user get u1",
             "user list",
             "role add r1",
             "role add r1",                                     # exists
             "role grant-permission r1 readwrite {P}a --prefix",
             "role grant-permission r1 read {P}r",
             "role grant-permission r1 write {P}w {P}x",
             "role grant-permission r1 read {P}f --from-key",
             "role grant-permission r1 read {P}r",              # identical: still a revision
             "role grant-permission nope read {P}a",
             "role grant-permission r1 bogus {P}a",
             "role get r1",
             "role get r1 -w json",
             "role revoke-permission r1 {P}zzz",                # not granted
             "role revoke-permission r1 {P}f --from-key",
             "role get r1",
             "user grant-role u1 r1",
             "user grant-role u1 r1",                           # already: no revision
             "user grant-role u1 nope",
             "user revoke-role u1 nope",
             "user get u1 -w json",
             "role list",
             "auth status",
             "auth enable",                                     # adds the root role itself
             "auth status",
             ROOT + " auth status",
             ROOT + " auth status -w json",
             "--user root --password rootpw user list -w json",
             ROOT + " user get u1 --detail",
             ROOT + " user list",
             ROOT + " role list",
             ROOT + " user delete root",                        # not while auth is on
             ROOT + " role delete root",
             ROOT + " user revoke-role root root",
             "get {P}a",                                        # no user
             "--user u1:wrong get {P}a",
             "--user nobody:x get {P}a",
             "--user u2:x get {P}a",                            # a no-password user
             U1 + " put {P}a1 v1",
             U1 + " put {P}b v",                                # denied
             U1 + " get {P}a1",
             U1 + " get --prefix {P}a",
             U1 + " get --prefix {P}",                          # wider than granted
             U1 + " put {P}r v",                                # read-only key
             U1 + " get {P}r",
             U1 + " put {P}w1 v",                               # write-only range
             U1 + " get {P}w1",
             U1 + " del {P}a1",
             U1 + " del --prefix {P}",
             TXN(txn_input(['value("{P}a1") = "x"'], ['put {P}a2 t'], ['put {P}a3 f']),
                 flags=U1),
             TXN(txn_input(['value("{P}b") = "x"'], ['put {P}a2 t'], [])),
             TXN(txn_input([], ['put {P}a2 t'], ['put {P}zz f']), flags=U1),
             W(U1 + " watch {P}b"),                              # canceled: not readable
             W("watch {P}a1"),                                  # canceled: no user
             U1 + " lock {P}alock echo locked",
             U1 + " lock {P}b echo never",
             U1 + " elect {P}aelect cand1 -l",                   # the leader: none yet
             U1 + " defrag",                                    # root's: the raw auth error
             U1 + " endpoint hashkv",
             U1 + " user get u1",                               # its own record
             U1 + " user get root",
             U1 + " user list",
             U1 + " role get r1",                               # a role it holds
             U1 + " role add r2",
             U1 + " auth disable",
             S(ROOT + " user passwd u1 --interactive=false", stdin="newpw\n"),
             U1 + " get {P}a1",                                 # the old password
             "--user u1:newpw get {P}a1",
             ROOT + " put {P}b rootcan",
             ROOT + " get --prefix {P}",
             ROOT + " user revoke-role u1 r1",
             U1 + " get {P}a1",
             ROOT + " auth disable",
             "auth status",
             "get --prefix {P}",
             "role delete r1",
             "role delete nope",
             "user delete u1",
             "user delete u2",
             "user delete root",
             "role delete root",
             "user list",
             "role list",
             "auth status")
