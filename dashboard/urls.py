from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from collectors import api

urlpatterns = [
    path("api/v1/ingest", api.ingest, name="ingest"),
    path("api/v1/openapi.json", api.openapi_description, name="ingest_openapi"),
    path("admin/", admin.site.urls),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("dashboard.views.urls")),
]
